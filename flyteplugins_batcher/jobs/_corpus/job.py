"""Embed a corpus on reusable GPU replicas, with length-aware `@batched` batches.

    flyte run --local workflows/embed.py main                       # our sample, all-MiniLM-L6-v2 on CPU, offline
    flyte run --local workflows/embed.py main --corpus docs.jsonl   # {"id"?, "text"} per line, or a .txt file
    EMBED_MODEL=BAAI/bge-small-en-v1.5 flyte run workflows/embed.py main --corpus s3://bucket/docs.jsonl

The driver reads the corpus (a JSONL file of `{"id"?, "text"}`, or a text file with one document
per line, ids being line numbers) and fans chunks out to `embed_chunk`. On a replica, every
concurrent call feeds the embedding replica's one batched function (`flyteplugins_batcher.replica`), which
forms batches of documents of similar length from everything waiting, so that little compute goes to padding.
Each chunk writes its vectors to a Parquet file; the driver joins them into one Parquet file of
`id` and `vector` columns (`pandas.read_parquet` or `pyarrow.parquet.read_table` load it directly),
and writes the documents that failed (an empty one, say) to an errors file.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from flyte.io import File

from flyteplugins_batcher.jobs._corpus.chunks import ChunkVectors, DocumentChunk
from flyteplugins_batcher.jobs._driver import JsonLines, check_failures
from flyteplugins_batcher.jobs._environments import driver_environment, embed_env
from flyteplugins_batcher.jobs._options import task_with_options
from flyteplugins_batcher.jobs._outputs import Destination, WorkFolder
from flyteplugins_batcher.jobs._replica_tasks import embed_chunk, write_parquet
from flyteplugins_batcher.jobs._report import STYLE, Progress, cards_html, print_report_location
from flyteplugins_batcher.jobs._report_charts import timeline_section
from flyteplugins_batcher.jobs._reruns import retrying_reused_failures
from flyteplugins_batcher.replica import ReplicaSnapshot

SAMPLE_CORPUS = Path(__file__).resolve().parents[1] / "data" / "embed_sample.jsonl"
OUTPUT_FILES = ("vectors.parquet", "errors.jsonl")

embed_driver_env = driver_environment("embed_driver", embed_env)


@dataclass
class EmbedSummary:
    """What an embedding run prints: counts, throughput at the model, batching, and where the files are."""

    corpus: str
    documents: int
    embedded: int
    failed: int
    dimensions: int
    documents_per_s: float  # at the model, on the busiest replica since it started
    avg_batch_size: float
    padding_efficiency: float
    truncated: int
    vectors: File
    errors: File
    reused: int = 0  # documents embedded by an earlier run of the same corpus (Flyte's cache)
    retried: int = 0  # documents an earlier run failed, which this run sent to the model again


@task_with_options(embed_driver_env, report=True)
async def embed_corpus(
    corpus: str = "sample",
    chunk_size: int = 64,
    output_dir: str = "",
    max_failed_fraction: float = 0.1,
    resume: bool = True,
) -> EmbedSummary:
    """Embed every document of a corpus; write their vectors to Parquet.

    Args:
        corpus: "sample" (documents we wrote, of mixed lengths), or a local path or URI of a .jsonl
            (`{"id"?, "text"}` per line) or .txt (one document per line) file.
        chunk_size: Documents per `embed_chunk` call.
        output_dir: Where `vectors.parquet` and `errors.jsonl` go: a local folder, a file:// URI or a remote URI,
            checked before any inference; empty: the run's own Flyte storage.
        max_failed_fraction: Share of documents that may fail (empty ones, say) before the run
            exits non-zero; the vectors are written either way.
        resume: Reuse chunks embedded by an earlier run with the same documents.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    destination = Destination.check(output_dir, OUTPUT_FILES)  # before any inference
    path = await corpus_path(corpus)
    chunks = list(read_chunks(path, chunk_size))
    if not chunks:
        raise ValueError(f"{corpus}: the corpus has no documents")
    documents = sum(len(chunk.ids) for chunk in chunks)
    progress = Progress(f"Embeddings: {corpus}", total=documents, noun="documents")
    started = time.time()
    results = await embed_all(chunks, progress, salt="" if resume else uuid.uuid4().hex, started=started)
    wall = time.time() - started
    work = WorkFolder("embed-", destination)
    embedded, dimensions = await write_outputs(chunks, results, work.path)
    latest = max(results, key=lambda result: result.model_seconds)  # the replica that did the most work
    vectors, errors = await work.publish([work.path / name for name in OUTPUT_FILES])
    summary = EmbedSummary(
        corpus=str(corpus),
        documents=documents,
        embedded=embedded,
        failed=documents - embedded,
        dimensions=dimensions,
        documents_per_s=latest.documents_per_s,
        avg_batch_size=latest.avg_batch_size,
        padding_efficiency=latest.padding_efficiency,
        truncated=sum(result.truncated for result in results),
        vectors=vectors,
        errors=errors,
        reused=sum(not result.computed_since(n, started) for result in results for n in range(len(result.results))),
        retried=sum(result.was_retried(n) for result in results for n in range(len(result.results))),
    )
    await progress.finish(report_html(summary, wall, results, started))
    print(summary_line(summary), flush=True)
    print_report_location()
    check_failures(summary.failed, documents, max_failed_fraction, f"see {summary.errors.path}", noun="documents")
    return summary


def summary_line(summary: EmbedSummary) -> str:
    """The one line an embedding run prints."""
    reruns = f", {summary.reused} reused from an earlier run" if summary.reused else ""
    reruns += f", {summary.retried} retried" if summary.retried else ""
    return (
        f"embedded {summary.embedded}/{summary.documents} documents ({summary.dimensions} dimensions), "
        f"{summary.failed} failed, {summary.truncated} truncated{reruns} | {summary.documents_per_s:.1f} documents/s "
        f"at the model, avg batch {summary.avg_batch_size:.1f}, padding efficiency {summary.padding_efficiency:.0%} | "
        f"vectors: {summary.vectors.path} | errors: {summary.errors.path}"
    )


async def embed_all(
    chunks: list[DocumentChunk], progress: Progress, *, salt: str, started: float
) -> list[ChunkVectors]:
    """Every chunk's vectors, in order, embedded concurrently; the progress shows chunks as they finish.

    A chunk embedded by an earlier run (Flyte's cache) is reused, but its failed documents are sent
    to the model again (`retrying_reused_failures`).
    """
    done = failed = 0
    infer = retrying_reused_failures(
        lambda chunk, cache_salt: embed_chunk(replace(chunk, cache_salt=cache_salt)), salt=salt, started=started
    )

    async def one(chunk: DocumentChunk) -> ChunkVectors:
        nonlocal done, failed
        result = await infer(chunk)
        done, failed = done + len(chunk.ids), failed + len(result.failed_positions())
        await progress.update(done, failed)
        return result

    return list(await asyncio.gather(*(one(chunk) for chunk in chunks)))


async def write_outputs(chunks: list[DocumentChunk], results: list[ChunkVectors], folder: Path) -> tuple[int, int]:
    """`vectors.parquet` and `errors.jsonl` in `folder`; returns (vectors, dimensions)."""
    errors = JsonLines(folder / "errors.jsonl")
    for chunk, result in zip(chunks, results, strict=True):
        for position in result.failed_positions():
            errors.write({"id": chunk.ids[position], "error": result.results[position].error_message})
    errors.close()
    return await join_parquet([part for result in results for part in result.vectors], folder / "vectors.parquet")


async def corpus_path(corpus: str) -> Path:
    """A local path to the corpus: our sample, a local file, or a downloaded remote one."""
    if corpus == "sample":
        return SAMPLE_CORPUS
    local = Path(corpus).expanduser()
    if local.is_file():
        return local
    if "://" not in corpus:
        raise FileNotFoundError(f"corpus {corpus!r} is not 'sample', an existing file, or a URI")
    return Path(await File.from_existing_remote(corpus).download())


def read_chunks(path: Path, chunk_size: int) -> Iterator[DocumentChunk]:
    """Chunks of a .jsonl (`{"id"?, "text"}`) or text corpus; a line that is not a document raises, naming it."""
    ids: list[str] = []
    texts: list[str] = []
    number = 0
    with path.open(encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            doc_id, text = _document(path, line_number, line.rstrip("\n"))
            if doc_id is None:
                continue
            ids.append(doc_id)
            texts.append(text)
            if len(ids) == chunk_size:
                yield DocumentChunk(number, ids, texts)
                number, ids, texts = number + 1, [], []
    if ids:
        yield DocumentChunk(number, ids, texts)


def _document(path: Path, line_number: int, line: str) -> tuple[str | None, str]:
    if path.suffix != ".jsonl":
        return str(line_number), line
    if not line.strip():
        return None, ""
    try:
        row = json.loads(line)
        text = row["text"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{path}:{line_number}: a document line needs a 'text' field ({error})") from None
    return str(row.get("id", line_number)), str(text)


async def join_parquet(parts: list[File], target: Path) -> tuple[int, int]:
    """One Parquet file from the chunks' files, written part by part; returns (rows, dimensions)."""
    import pyarrow.parquet as pq

    writer = None
    rows = dimensions = 0
    try:
        for part in parts:
            table = pq.read_table(await part.download())
            if not table.num_rows:
                continue
            if writer is None:
                writer = pq.ParquetWriter(target, table.schema)
                dimensions = len(table.column("vector")[0])
            writer.write_table(table)
            rows += table.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        write_parquet(target, [], [])
    return rows, dimensions


def report_html(
    summary: EmbedSummary, wall_s: float, results: Sequence[ChunkVectors] = (), started_at: float | None = None
) -> str:
    """The run's report: counts, throughput at the model, batching, and where the time went on each replica."""
    cards = [
        ("embedded", f"{summary.embedded}/{summary.documents}"),
        ("failed", str(summary.failed)),
        ("documents/s (model)", f"{summary.documents_per_s:.1f}"),
        ("avg batch", f"{summary.avg_batch_size:.1f}"),
        ("padding efficiency", f"{summary.padding_efficiency:.0%}"),
        ("truncated", str(summary.truncated)),
        ("wall time", f"{wall_s:.1f}s"),
    ]
    return (
        f'{STYLE}<div class="bl"><h2>Embeddings: {summary.corpus}</h2>{cards_html(cards)}'
        f"<p>Vectors: <code>{summary.vectors.path}</code><br>Errors: <code>{summary.errors.path}</code></p>"
        f"{timeline_section(latest_replicas(results, started_at or 0.0), wall_s, started_at)}</div>"
    )


def latest_replicas(results: Sequence[ChunkVectors], since: float = 0.0) -> list[ReplicaSnapshot]:
    """Each replica's latest snapshot among the chunks finished `since` (epoch seconds), not reused from before."""
    latest: dict[str, ReplicaSnapshot] = {}
    for result in results:
        snapshot = result.replica
        if snapshot is None or result.finished_at < since:
            continue
        known = latest.get(snapshot.replica)
        if known is None or snapshot.records >= known.records:  # a replica's counters only grow
            latest[snapshot.replica] = snapshot
    return sorted(latest.values(), key=lambda snapshot: snapshot.replica)
