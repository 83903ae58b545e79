"""vLLM's pooling lines beside embeddings: score, rerank and classify bodies, read and answered in vLLM's shapes.

As vLLM's `ScoreRequest`, `RerankRequest` and `ClassificationRequest` take them:

- score (`/score`, `/v1/score`): `queries` and `documents` (or `queries`/`items`, `data_1`/`data_2`,
  `text_1`/`text_2`), each a string or a list of strings: one query and N documents, or N and N
  (1:1, 1:N or N:N). Answered with vLLM's `ScoreResponse`: `data[i].score` per pair, in order.
- rerank (`/rerank`, `/v1/rerank`, `/v2/rerank`): one `query`, `documents`, `top_n` (0: all).
  Answered with vLLM's `RerankResponse`: `results` best first, each with its `index`, `document.text`
  and `relevance_score`.
- classify (`/classify`): `input`, a string or a list of strings. Answered with vLLM's
  `ClassificationResponse`: `data[i]` with `probs`, `num_classes` and the `label` of the most likely class.

`use_activation` (`false`: raw logits) is honoured. What this package does not do is refused by
name rather than ignored: token ids and multimodal content, per-request truncation
(`truncate_prompt_tokens`, `max_tokens_per_query`, `max_tokens_per_doc`), score templates
(`instruction`, `chat_template_kwargs`), `padding`, and classify's chat `messages`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from flyteplugins_batcher.batch_api._embeddings import EmbeddingRequest, texts
from flyteplugins_batcher.batch_api._fields import INT64, FieldChecks

SCORE_FIELDS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))
"""The pairs of fields a score request may name its two sides with, as vLLM's score requests do."""

_TRUNCATION = "is not supported (texts are never cut: one longer than the model fails its request)"
_REFUSED = {
    "truncate_prompt_tokens": _TRUNCATION,
    "max_tokens_per_query": _TRUNCATION,
    "max_tokens_per_doc": _TRUNCATION,
    "instruction": "is not supported (score templates are not)",
    "chat_template_kwargs": "is not supported (score templates are not)",
    "padding": "is not supported",
    "mm_processor_kwargs": "is not supported (multimodal content is not)",
    "messages": "is not supported: classify takes `input` texts",
}
"""vLLM's fields this package does not honour, refused by name (null, 0 and false are their defaults)."""


def pooling_request(body: Mapping[str, Any], checks: FieldChecks, url: str, task: str) -> EmbeddingRequest:
    """A score, rerank or classify line's request (`task` says which), checked as vLLM checks it.

    Raises:
        RequestLineError: `invalid_body` for missing or malformed texts, `invalid_request` for a
            setting out of range or one this package does not honour (named).
    """
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, 0, False, -1) and not (key == "messages" and task != "classify"):
            raise checks.invalid(key, why)
    activation = checks.boolean(body, "use_activation")
    common: dict[str, Any] = {"model": body.get("model"), "endpoint": url, "use_activation": activation is not False}
    line, custom_id = checks.line, str(checks.custom_id)
    if task == "classify":
        return EmbeddingRequest(line, custom_id, texts(body.get("input"), checks, "input", "to classify"), **common)
    if task == "rerank":
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            raise checks.fail("invalid_body", f"{checks.prefix}query must be a non-empty string (one query)")
        documents = texts(body.get("documents"), checks, "documents", "to rank")
        top_n = checks.integer(body, "top_n", 0, INT64 - 1) or 0
        return EmbeddingRequest(line, custom_id, documents, queries=(query,), top_n=top_n, **common)
    first, second = _score_fields(body, checks)
    queries = texts(body.get(first), checks, first, "to score")
    documents = texts(body.get(second), checks, second, "to score")
    if len(queries) > 1 and len(queries) != len(documents):
        raise checks.fail(
            "invalid_body",
            f"{checks.prefix}{first} has {len(queries)} texts and {checks.prefix}{second} {len(documents)}: "
            "the lengths must be 1:1, 1:N or N:N",
        )
    return EmbeddingRequest(line, custom_id, documents, queries=queries, **common)


def _score_fields(body: Mapping[str, Any], checks: FieldChecks) -> tuple[str, str]:
    """The two fields a score request names its sides with (the first pair of `SCORE_FIELDS` it gives)."""
    for first, second in SCORE_FIELDS:
        if first in body and second in body:
            return first, second
    spelled = ", ".join(f"{first}/{second}" for first, second in SCORE_FIELDS)
    raise checks.fail("invalid_body", f"a score request needs two sides to score: one of {spelled}")


def pooling_body(
    request: EmbeddingRequest,
    outputs: Sequence[Sequence[float]],
    *,
    prompt_tokens: int,
    model: str,
    response_id: str,
    labels: Sequence[str | None] = (),
) -> dict[str, Any]:
    """A score's, rerank's or classify's answer in vLLM's shape (see the module notes).

    Args:
        request: The parsed line.
        outputs: A score's or rerank's score per pair (each a sequence of one), a classify's
            probabilities (or logits) per text.
        prompt_tokens: Tokens the model read for the whole request.
        model: The model that answered.
        response_id: The answer's id.
        labels: A classify's label per text (its most likely class's name, when the model names its classes).

    Raises:
        ValueError: The number of outputs is not the number of pairs (or texts).
    """
    if len(outputs) != len(request.inputs):
        raise ValueError(f"{request.custom_id}: {len(request.inputs)} inputs but {len(outputs)} outputs")
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    if request.task == "rerank":
        results = [
            {"index": index, "document": {"text": text, "multi_modal": None}, "relevance_score": float(output[0])}
            for index, (text, output) in enumerate(zip(request.inputs, outputs, strict=True))
        ]
        results.sort(key=lambda result: result["relevance_score"], reverse=True)
        return {"id": response_id, "model": model, "usage": usage, "results": results[: request.top_n or None]}
    usage |= {"completion_tokens": 0, "prompt_tokens_details": None}
    head = {"id": response_id, "object": "list", "created": int(time.time()), "model": model}
    if request.task == "score":
        data = [{"index": index, "object": "score", "score": float(output[0])} for index, output in enumerate(outputs)]
        return {**head, "data": data, "usage": usage}
    names = list(labels) or [None] * len(outputs)
    data = [
        {"index": index, "label": label, "probs": [float(value) for value in output], "num_classes": len(output)}
        for index, (output, label) in enumerate(zip(outputs, names, strict=True))
    ]
    return {**head, "data": data, "usage": usage}
