"""Embed a corpus on reusable replicas, with length-aware `@batched` batches: the table job's embeddings.

    flyte run --local workflows/embed.py main                       # our sample, all-MiniLM-L6-v2 on CPU, offline
    flyte run --local workflows/embed.py main --corpus docs.jsonl   # {"id"?, "text"} per line, or a .txt file
    EMBED_MODEL=BAAI/bge-small-en-v1.5 flyte run workflows/embed.py main --corpus s3://bucket/docs.jsonl

`embed_corpus` is `run_table` with `task_type="embed"` over the `text` column of a corpus: a JSONL file
of `{"id"?, "text"}` lines (any other fields are kept too), or a text file with one document per
line, read as `id` (its line number) and `text`. Its chunks go to `embed_requests` on the embedding
replicas, where every concurrent call feeds the replica's one batched function, which forms batches
of documents of similar length so that little compute goes to padding. The output is the table's
Parquet dataset: the corpus's columns, `embedding` (a fixed-size list of float32), `num_input_tokens`
and `error` (null, or why the document failed: an empty one, say).
"""

from __future__ import annotations

import asyncio

from flyteplugins_batcher.jobs._options import task_with_options
from flyteplugins_batcher.jobs._run_options import RunOptions
from flyteplugins_batcher.jobs._summary import RunSummary
from flyteplugins_batcher.jobs._table.options import TableOptions
from flyteplugins_batcher.jobs._table.task import table_driver_env
from flyteplugins_batcher.replica import EngineSettings


@task_with_options(table_driver_env, report=True)
async def embed_corpus(
    corpus: str = "sample",
    chunk_size: int = 64,
    output_dir: str = "",
    max_failed_fraction: float = 0.1,
    resume: bool = True,
) -> RunSummary:
    """Embed every document of a corpus; write the corpus with each document's vector, as Parquet.

    Args:
        corpus: "sample" (documents we wrote, of mixed lengths), or a local path or URI of a .jsonl
            (`{"id"?, "text"}` per line) or .txt (one document per line) file.
        chunk_size: Documents per `embed_requests` call.
        output_dir: Where the Parquet dataset goes: a local folder, a file:// URI or a remote URI,
            checked before any inference; empty: the run's own Flyte storage.
        max_failed_fraction: Share of documents that may fail (empty ones, say) before the run
            exits non-zero; the output is written either way.
        resume: Reuse chunks embedded by an earlier run with the same documents.
    """
    # Arrow's modules: the driver image has them, the replicas' images (which import this one) may not.
    from flyteplugins_batcher.jobs._corpus.lines import corpus_table
    from flyteplugins_batcher.jobs._table.driver import run_table_job

    options = TableOptions(task_type="embed", column="text", embedding_chunk_size=chunk_size)
    run = RunOptions(
        chunk_size=chunk_size, max_failed_fraction=max_failed_fraction, resume=resume, output_dir=output_dir
    )
    source = await asyncio.to_thread(corpus_table, corpus)
    return await run_table_job(source, options, run, EngineSettings(), noun="documents")
