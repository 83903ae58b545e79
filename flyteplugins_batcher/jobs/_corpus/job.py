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
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from flyteplugins_batcher.jobs._driver import RunOptions
from flyteplugins_batcher.jobs._options import task_with_options
from flyteplugins_batcher.jobs._table.options import TableOptions
from flyteplugins_batcher.jobs._table.source import TableSource, open_table
from flyteplugins_batcher.jobs._table.summary import TableSummary
from flyteplugins_batcher.jobs._table.task import run_table_job, table_driver_env
from flyteplugins_batcher.replica import EngineSettings

SAMPLE_CORPUS = Path(__file__).resolve().parents[1] / "data" / "embed_sample.jsonl"
_LINES = pa.schema([("id", pa.string()), ("text", pa.string())])


@task_with_options(table_driver_env, report=True)
async def embed_corpus(
    corpus: str = "sample",
    chunk_size: int = 64,
    output_dir: str = "",
    max_failed_fraction: float = 0.1,
    resume: bool = True,
) -> TableSummary:
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
    options = TableOptions(task_type="embed", column="text", embedding_chunk_size=chunk_size)
    run = RunOptions(
        chunk_size=chunk_size, max_failed_fraction=max_failed_fraction, resume=resume, output_dir=output_dir
    )
    source = await asyncio.to_thread(corpus_table, corpus)
    return await run_table_job(source, options, run, EngineSettings(), noun="documents")


def corpus_table(corpus: str) -> TableSource:
    """The corpus as a table: our sample, a JSONL file, or a text file's lines (`id`, `text`), local or remote.

    Raises:
        FileNotFoundError: A local path that names no file.
    """
    path = str(SAMPLE_CORPUS) if corpus == "sample" else corpus
    if "://" not in path:
        path = str(Path(path).expanduser())
        if not Path(path).is_file():
            raise FileNotFoundError(f"corpus {corpus!r} is not 'sample', an existing file, or a URI")
    if path.endswith(".txt"):
        return TableSource(corpus, _LINES, None, lambda rows: _lines(path, rows))
    return replace(open_table(path), description=corpus)


def _lines(path: str, rows: int) -> Iterator[pa.RecordBatch]:
    """A text file's lines as record batches of `id` (the line's number, from 1) and `text`."""
    import flyte.storage

    ids: list[str] = []
    texts: list[str] = []
    filesystem = flyte.storage.get_underlying_filesystem(path=path)  # this machine's, or an object store's
    with filesystem.open(path, "r", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            ids.append(str(number))
            texts.append(line.rstrip("\n"))
            if len(ids) == rows:
                yield pa.record_batch([ids, texts], schema=_LINES)
                ids, texts = [], []
    if ids:
        yield pa.record_batch([ids, texts], schema=_LINES)
