"""Embedding lines (`"url": "/v1/embeddings"`): what they hold, and parsing their body."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from flyteplugins_batcher.batch_api._fields import FieldChecks

EMBEDDINGS_ENDPOINT = "/v1/embeddings"

MAX_EMBEDDING_INPUTS = 2048
"""Most texts one embeddings request may hold, as OpenAI's API allows."""

EncodingFormat = Literal["float", "base64"]
ENCODING_FORMATS: tuple[str, ...] = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingRequest:
    """One parsed embeddings line: texts to embed, answered with one vector each.

    Attributes:
        line: Its 1-based line number in the input.
        custom_id: Its id.
        inputs: The texts, in order (a single `input` string is a list of one).
        encoding_format: `"float"` (vectors as lists of numbers) or `"base64"` (little-endian float32).
        model: The model its body asked for, if any.

    Example:
        ```python
        request = parse_request_line(text, number, served_embedding_model="all-MiniLM-L6-v2")
        if isinstance(request, EmbeddingRequest):
            vectors = model.encode(list(request.inputs))
            line = embedding_response_line(request, vectors, prompt_tokens=tokens, model=name, request_number=number)
        ```
    """

    kind: ClassVar[str] = "embedding"
    endpoint: ClassVar[str] = EMBEDDINGS_ENDPOINT

    line: int
    custom_id: str
    inputs: tuple[str, ...]
    encoding_format: EncodingFormat = "float"
    model: str | None = None


def parse_embedding_body(body: Mapping[str, Any], checks: FieldChecks) -> tuple[tuple[str, ...], EncodingFormat]:
    """The texts and encoding format of an embeddings body.

    Raises:
        RequestLineError: `invalid_body` for a missing, empty or token-id `input`;
            `invalid_request` for an unknown `encoding_format` or a `dimensions` this server cannot honour.
    """
    inputs = _inputs(body.get("input"), checks)
    encoding_format = body.get("encoding_format") or "float"
    if encoding_format not in ENCODING_FORMATS:
        raise checks.invalid("encoding_format", f"must be 'float' or 'base64', got {encoding_format!r}")
    if body.get("dimensions") is not None:
        raise checks.invalid(
            "dimensions", "is not supported: vectors have the served model's own size (remove the field)"
        )
    return inputs, encoding_format


def _inputs(value: Any, checks: FieldChecks) -> tuple[str, ...]:
    where = f"{checks.prefix}input"
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise checks.fail("invalid_body", f"{where} must be a non-empty string or a non-empty list of strings")
    if any(isinstance(item, (int, list)) for item in texts):
        raise checks.fail(
            "invalid_body", f"{where}: token-id arrays are not supported; send the texts as strings instead"
        )
    if not all(isinstance(item, str) for item in texts):
        raise checks.fail("invalid_body", f"{where} must hold only strings")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise checks.fail("invalid_body", f"{where} may hold at most {MAX_EMBEDDING_INPUTS} texts, got {len(texts)}")
    empty = [index for index, text in enumerate(texts) if not text.strip()]
    if empty:
        position = "" if isinstance(value, str) else f"[{empty[0]}]"
        raise checks.fail("invalid_body", f"{where}{position} is empty: there is no text to embed")
    return tuple(texts)
