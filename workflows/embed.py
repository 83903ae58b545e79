"""Embed a corpus on reusable GPU replicas, with length-aware `@batched` batches.

    flyte run --local workflows/embed.py main                       # our sample, all-MiniLM-L6-v2 on CPU, offline
    flyte run --local workflows/embed.py main --corpus docs.jsonl   # {"id"?, "text"} per line, or a .txt file
    EMBED_MODEL=BAAI/bge-small-en-v1.5 flyte run workflows/embed.py main --corpus s3://bucket/docs.jsonl

The driver reads the corpus (a JSONL file of `{"id"?, "text"}`, or a text file with one document
per line, ids being line numbers) and fans chunks out to `embed_chunk`. On a replica, every
concurrent call feeds one `@batched` function (`workflows/embeddings.py`), which forms batches of
documents of similar length from everything waiting, so that little compute goes to padding.
Each chunk writes its vectors to a Parquet file; the driver joins them into one Parquet file of
`id` and `vector` columns (`pandas.read_parquet` or `pyarrow.parquet.read_table` load it directly),
and writes the documents that failed (an empty one, say) to an errors file.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import flyte
import flyte.report
from flyte.io import File

from flyteplugins_batcher import inference_environment
from images import driver_image, embed_image
from workflows.driver import JsonLines, check_failures, publish
from workflows.embeddings import EMBED_STATS, embed, load_model, model_reference
from workflows.report import STYLE, cards_html

SAMPLE_CORPUS = Path(__file__).resolve().parent / "data" / "embed_sample.jsonl"
GPU = os.environ.get("EMBED_GPU", "L4:1")

embed_env = inference_environment(
    "embed_gpu",
    image=embed_image,
    gpu=None if GPU.lower() == "none" else GPU,
    replicas=int(os.environ.get("EMBED_REPLICAS", "2")),
    concurrency=int(os.environ.get("EMBED_CONCURRENCY", "8")),
)

driver_env = flyte.TaskEnvironment(
    name="embed_driver",
    image=driver_image,
    resources=flyte.Resources(cpu=2, memory="4Gi"),
    depends_on=[embed_env],
)


@dataclass
class DocumentChunk:
    """Documents for one `embed_chunk` call."""

    index: int
    ids: list[str]
    texts: list[str]
    cache_salt: str = ""  # a fresh value makes the chunk run again instead of reusing an earlier run's vectors


@dataclass
class ChunkVectors:
    """A chunk's vectors (a Parquet file of `id`, `vector`), its failures, and its replica's batching."""

    index: int
    vectors: File
    failed_ids: list[str]
    failures: list[str]
    documents_per_s: float
    avg_batch_size: float
    padding_efficiency: float
    truncated: int  # documents of this chunk cut at the model's max_seq_length
    model_seconds: float


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


@embed_env.task(retries=2, cache="auto")
async def embed_chunk(chunk: DocumentChunk) -> ChunkVectors:
    """Embed one chunk through the replica's shared, length-aware `@batched` function."""
    await asyncio.to_thread(load_model, model_reference())  # once per replica, off the event loop
    outcomes = await asyncio.gather(*(embed(text) for text in chunk.texts), return_exceptions=True)
    ids, vectors, failed_ids, failures = [], [], [], []
    truncated = 0
    for doc_id, outcome in zip(chunk.ids, outcomes, strict=True):
        if isinstance(outcome, ValueError):
            failed_ids.append(doc_id)
            failures.append(str(outcome))
        elif isinstance(outcome, BaseException):
            raise outcome  # not this document's fault: let Flyte retry the chunk
        else:
            ids.append(doc_id)
            vectors.append(outcome.vector)
            truncated += outcome.truncated
    path = Path(tempfile.mkdtemp(prefix="embed-chunk-")) / f"chunk-{chunk.index:06d}.parquet"
    await asyncio.to_thread(write_parquet, path, ids, vectors)
    stats = embed.stats
    return ChunkVectors(
        index=chunk.index,
        vectors=await File.from_local(str(path)),
        failed_ids=failed_ids,
        failures=failures,
        documents_per_s=EMBED_STATS.documents / EMBED_STATS.model_seconds if EMBED_STATS.model_seconds else 0.0,
        avg_batch_size=stats.avg_batch_size,
        padding_efficiency=EMBED_STATS.padding_efficiency,
        truncated=truncated,
        model_seconds=EMBED_STATS.model_seconds,
    )


@driver_env.task(report=True)
async def main(
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
        output_dir: Also copy `vectors.parquet` and `errors.jsonl` here (a local folder or a URI).
        max_failed_fraction: Share of documents that may fail (empty ones, say) before the run
            exits non-zero; the vectors are written either way.
        resume: Reuse chunks embedded by an earlier run with the same documents.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    path = await corpus_path(corpus)
    salt = "" if resume else uuid.uuid4().hex
    chunks = [replace(chunk, cache_salt=salt) for chunk in read_chunks(path, chunk_size)]
    if not chunks:
        raise ValueError(f"{corpus}: the corpus has no documents")
    started = time.perf_counter()
    results = await asyncio.gather(*(embed_chunk(chunk) for chunk in chunks))
    wall = time.perf_counter() - started
    folder = Path(tempfile.mkdtemp(prefix="embed-"))
    errors = JsonLines(folder / "errors.jsonl")
    for result in results:
        for doc_id, message in zip(result.failed_ids, result.failures, strict=True):
            errors.write({"id": doc_id, "error": message})
    errors.close()
    embedded, dimensions = await join_parquet([result.vectors for result in results], folder / "vectors.parquet")
    latest = max(results, key=lambda result: result.model_seconds)  # the replica that did the most work
    documents = sum(len(chunk.ids) for chunk in chunks)
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
        vectors=await publish(folder / "vectors.parquet", output_dir),
        errors=await publish(errors.path, output_dir),
    )
    await flyte.report.replace.aio(report_html(summary, wall), do_flush=True)
    print(
        f"embedded {summary.embedded}/{summary.documents} documents ({summary.dimensions} dimensions), "
        f"{summary.failed} failed, {summary.truncated} truncated | {summary.documents_per_s:.1f} documents/s at the "
        f"model, avg batch {summary.avg_batch_size:.1f}, padding efficiency {summary.padding_efficiency:.0%} | "
        f"vectors: {summary.vectors.path} | errors: {summary.errors.path}",
        flush=True,
    )
    check_failures(summary.failed, documents, max_failed_fraction, f"see {summary.errors.path}", noun="documents")
    return summary


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


def write_parquet(path: Path, ids: list[str], vectors: list[list[float]]) -> None:
    """`id` and `vector` (a list of float32) columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": pa.array(ids, pa.string()), "vector": pa.array(vectors, pa.list_(pa.float32()))})
    pq.write_table(table, path)


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


def report_html(summary: EmbedSummary, wall_s: float) -> str:
    """The run's report: counts, throughput at the model, batching."""
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
        f"<p>Vectors: <code>{summary.vectors.path}</code><br>Errors: <code>{summary.errors.path}</code></p></div>"
    )
