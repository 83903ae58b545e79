"""Embedding lines (`"url": "/v1/embeddings"`): parsing them, and answering in OpenAI's embeddings shape."""

from __future__ import annotations

import array
import base64
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from flyteplugins_batcher.batch_api._generation import FieldChecks
from flyteplugins_batcher.batch_api._results import output_line

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


def embedding_response_line(
    request: EmbeddingRequest,
    vectors: Sequence[Sequence[float]],
    *,
    prompt_tokens: int,
    model: str,
    request_number: int,
) -> dict[str, Any]:
    """The output line for an embeddings request that succeeded, in OpenAI's embeddings response shape.

    `response.body` is `{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": ...}],
    "model", "usage": {"prompt_tokens", "total_tokens"}}`; each embedding is a list of floats, or
    with `encoding_format="base64"` the base64 text of its little-endian float32 bytes.

    Args:
        request: The parsed line.
        vectors: One vector per input text, in order (lists, tuples or 1-D numpy arrays).
        prompt_tokens: Tokens the model read for all the texts together.
        model: The model that answered.
        request_number: Numbers the response's ids (the input line number, say).

    Raises:
        ValueError: The number of vectors is not the number of texts.
    """
    if len(vectors) != len(request.inputs):
        raise ValueError(f"{request.custom_id}: {len(request.inputs)} texts but {len(vectors)} vectors")
    data = [
        {"object": "embedding", "index": index, "embedding": encode_vector(vector, request.encoding_format)}
        for index, vector in enumerate(vectors)
    ]
    body = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
    return output_line(request.custom_id, request_number, body)


def encode_vector(vector: Sequence[float], encoding_format: EncodingFormat) -> list[float] | str:
    """A vector as OpenAI returns it: a list of floats, or base64 of its little-endian float32 bytes.

    Example:
        ```python
        assert encode_vector([1.0], "base64") == "AACAPw=="
        ```
    """
    if encoding_format == "float":
        return [float(value) for value in vector]
    packed = array.array("f", (float(value) for value in vector))
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")
