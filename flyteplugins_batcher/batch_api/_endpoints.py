"""The urls a request line may name: one table, the one place an endpoint is declared.

Each row says which of a job's models answers the url (`model`: the LLM, or the encoder models
beside it: the embedding model, a cross-encoder or a classifier) and what it asks for (`task`).
Reading a line's body (`_requests.py`) and answering it (`_responses.py`) each look up the url's
task here and run that task's parser and answerer (one dict each, keyed by task): adding an endpoint
is a row here and a parser and an answerer for a new task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Task = Literal["chat", "completion", "responses", "embed", "score", "rerank", "classify"]
"""What a request asks for: text (`chat`, `completion`, `responses`) or an encoder's answer (the rest)."""

ServedBy = Literal["llm", "encoder"]
"""Which model answers: the LLM, or an encoder (the embedding model, a cross-encoder, a classifier)."""


@dataclass(frozen=True)
class Endpoint:
    """One url of the table: which model answers it, and what it asks for.

    Attributes:
        url: The url a line names (`"url"`), or an online route's path.
        served_by: `"llm"` or `"encoder"`.
        task: What it asks for (one parser and one answerer per task).
    """

    url: str
    served_by: ServedBy
    task: Task


ENDPOINT_TABLE: dict[str, Endpoint] = {
    endpoint.url: endpoint
    for endpoint in (
        Endpoint("/v1/chat/completions", "llm", "chat"),
        Endpoint("/v1/completions", "llm", "completion"),
        Endpoint("/v1/responses", "llm", "responses"),
        Endpoint("/v1/embeddings", "encoder", "embed"),
        # vLLM's pooling routes: score and rerank with an embedding model (cosine similarity) or a cross-encoder,
        # classify with a sequence classifier.
        Endpoint("/score", "encoder", "score"),
        Endpoint("/v1/score", "encoder", "score"),
        Endpoint("/rerank", "encoder", "rerank"),
        Endpoint("/v1/rerank", "encoder", "rerank"),
        Endpoint("/v2/rerank", "encoder", "rerank"),
        Endpoint("/classify", "encoder", "classify"),
    )
}
"""Every url this format knows, by url."""


def urls(*, served_by: ServedBy | None = None, tasks: tuple[Task, ...] = ()) -> tuple[str, ...]:
    """The table's urls, in its order: those one kind of model answers, or those of some tasks.

    Example:
        ```python
        assert urls(tasks=("rerank",)) == ("/rerank", "/v1/rerank", "/v2/rerank")
        ```
    """
    return tuple(
        url
        for url, endpoint in ENDPOINT_TABLE.items()
        if (served_by is None or endpoint.served_by == served_by) and (not tasks or endpoint.task in tasks)
    )
