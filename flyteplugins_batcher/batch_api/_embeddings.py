"""Encoder lines: embeddings (`"url": "/v1/embeddings"`) and vLLM's pooling urls (score, rerank, classify).

What such a line holds (`EmbeddingRequest`), and parsing an embeddings body; `_pooling.py` parses the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from flyteplugins_batcher.batch_api._endpoints import ENDPOINT_TABLE, Task, urls
from flyteplugins_batcher.batch_api._fields import FieldChecks

EMBEDDINGS_ENDPOINT = "/v1/embeddings"

MAX_EMBEDDING_INPUTS = 2048
"""Most texts one embeddings request may hold, as OpenAI's API allows."""

EncodingFormat = Literal["float", "base64"]
ENCODING_FORMATS: tuple[str, ...] = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingRequest:
    """One parsed line for an encoder model: texts to embed, pairs to score or rerank, or texts to classify.

    The url says which (`task`): `/v1/embeddings` (a vector per text), vLLM's `/score` and `/v1/score`
    (a score per query-document pair), `/rerank`, `/v1/rerank` and `/v2/rerank` (the documents
    ranked by their score against one query) and `/classify` (class probabilities per text). An
    embedding model scores a pair by the cosine similarity of the two texts' vectors, as vLLM does;
    a cross-encoder reads the pair together.

    Attributes:
        line: Its 1-based line number in the input.
        custom_id: Its id.
        inputs: The texts to embed or classify, in order (a single `input` string is a list of one), or
            the documents to score against `queries` (a score's `documents`/`text_2`/`data_2`, a rerank's
            `documents`).
        encoding_format: `"float"` (vectors as lists of numbers) or `"base64"` (little-endian float32).
        model: The model its body asked for, if any.
        endpoint: Its url (`/v1/embeddings` unless it is a score, rerank or classify line).
        queries: A score's or rerank's queries: one (scored against every document) or one per document.
        top_n: A rerank's number of best documents to answer with (0: all).
        use_activation: Whether a classifier's or cross-encoder's outputs go through its activation
            (sigmoid or softmax: probabilities), as vLLM's `use_activation` (`false`: raw logits).

    Example:
        ```python
        request = parse_request_line(text, number, served_embedding_model="all-MiniLM-L6-v2", endpoints=ENDPOINTS)
        if isinstance(request, EmbeddingRequest) and request.task == "embed":
            vectors = model.encode(list(request.inputs))
            line = embedding_response_line(request, vectors, prompt_tokens=tokens, model=name, request_number=number)
        ```
    """

    kind: ClassVar[str] = "embedding"
    URLS: ClassVar[tuple[str, ...]] = urls(served_by="encoder")
    """The urls whose lines become an `EmbeddingRequest` (embeddings, score, rerank, classify)."""

    line: int
    custom_id: str
    inputs: tuple[str, ...]
    encoding_format: EncodingFormat = "float"
    model: str | None = None
    endpoint: str = EMBEDDINGS_ENDPOINT
    queries: tuple[str, ...] = ()
    top_n: int = 0
    use_activation: bool = True

    @property
    def task(self) -> Task:
        """What it asks for: `"embed"`, `"score"`, `"rerank"` or `"classify"`."""
        return ENDPOINT_TABLE[self.endpoint].task

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """A score's or rerank's (query, document) pairs, in the documents' order: one query goes with every one."""
        queries = self.queries * len(self.inputs) if len(self.queries) == 1 else self.queries
        return tuple(zip(queries, self.inputs, strict=True))


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
    return texts(value, checks, "input", "to embed")


def texts(value: Any, checks: FieldChecks, key: str, purpose: str) -> tuple[str, ...]:
    """The texts of field `key`: a string, or a non-empty list of at most 2048 strings, none blank.

    Raises:
        RequestLineError: `invalid_body`, naming the field (and the item) and what is wrong.
    """
    where = f"{checks.prefix}{key}"
    items = [value] if isinstance(value, (str, dict)) else value  # a dict: vLLM's multimodal content, refused below
    if not isinstance(items, list) or not items:
        raise checks.fail("invalid_body", f"{where} must be a non-empty string or a non-empty list of strings")
    if any(isinstance(item, (int, list)) for item in items):
        raise checks.fail(
            "invalid_body", f"{where}: token-id arrays are not supported; send the texts as strings instead"
        )
    if not all(isinstance(item, str) for item in items):
        raise checks.fail("invalid_body", f"{where} must hold only strings (multimodal content is not supported)")
    if len(items) > MAX_EMBEDDING_INPUTS:
        raise checks.fail("invalid_body", f"{where} may hold at most {MAX_EMBEDDING_INPUTS} texts, got {len(items)}")
    empty = [index for index, text in enumerate(items) if not text.strip()]
    if empty:
        position = "" if isinstance(value, str) else f"[{empty[0]}]"
        raise checks.fail("invalid_body", f"{where}{position} is empty: there is no text {purpose}")
    return tuple(items)
