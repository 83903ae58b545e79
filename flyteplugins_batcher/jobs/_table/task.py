"""The table job: a table in, the same table out with each row's answer, as Ray Data LLM's processors map a dataset.

    flyteplugins-batcher run-table -i questions.parquet -o answers/ --prompt "Answer briefly: {question}"
    flyte run --local workflows/table.py main --input questions.parquet --prompt "Answer briefly: {question}"
    flyte run workflows/table.py main --input s3://bucket/questions/ --output_dir s3://bucket/answers

The driver (`run_table`, or a `TableProcessor` in a task of yours) reads the table a batch at a
time (`flyteplugins_batcher/jobs/_table/source.py`), makes each row's request
(`flyteplugins_batcher/jobs/_table/requests.py`), cuts the rows into chunks and fans them out with
`fan_out` to the replicas' tasks, `infer_chunk` (LLM) or `embed_requests` (embeddings), at most
`max_chunks_in_flight` at a time (by default every replica's slots). Each finished chunk becomes
one Parquet part of the output (`flyteplugins_batcher/jobs/_table/parts.py`), published at the end
(`flyteplugins_batcher/jobs/_table/publish.py`). A chunk is what Flyte caches: a rerun after a
crash recomputes only the chunks that had not finished, and sends the rows an earlier run failed
to the model again. The run exits non-zero when more rows failed than `max_failed_fraction`
allows, after writing everything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from flyte.io import DataFrame

from flyteplugins_batcher.engines import EmbeddingModel
from flyteplugins_batcher.jobs._driver import FanOutStats, RunOptions, check_failures, fan_out, occupancy_warning
from flyteplugins_batcher.jobs._environments import (
    EMBED_POOL,
    LLM_POOL,
    LLM_SIZING,
    ReplicaPool,
    driver_environment,
    embed_env,
    gpu_env,
)
from flyteplugins_batcher.jobs._options import task_with_options
from flyteplugins_batcher.jobs._outputs import PublishError, WorkFolder
from flyteplugins_batcher.jobs._replica_tasks import embed_requests, infer_chunk
from flyteplugins_batcher.jobs._report import print_report_location
from flyteplugins_batcher.jobs._reruns import retrying_reused_failures
from flyteplugins_batcher.jobs._table.job import TableJob
from flyteplugins_batcher.jobs._table.options import TableOptions, row_function
from flyteplugins_batcher.jobs._table.parts import TableParts, job_columns, unify_parts
from flyteplugins_batcher.jobs._table.publish import check_output, publish_parts
from flyteplugins_batcher.jobs._table.requests import RowRequests
from flyteplugins_batcher.jobs._table.source import TableSource, open_table
from flyteplugins_batcher.jobs._table.summary import TableSummary, report_html, summary_line
from flyteplugins_batcher.replica import (
    ChunkOutcome,
    EmbeddingChunk,
    EmbeddingOutcome,
    EngineSettings,
    JobChunk,
    JobOutcome,
    ReplicaSnapshot,
)

table_driver_env = driver_environment("batch_table_driver", gpu_env, embed_env)


@task_with_options(table_driver_env, report=True)
async def run_table(
    input: DataFrame | str,
    rows: TableOptions = TableOptions(),
    run: RunOptions = RunOptions(chunk_size=LLM_SIZING.chunk_size),
    settings: EngineSettings = EngineSettings(),
) -> TableSummary:
    """Answer every row of a table with an LLM (or embed it); write the table with each row's answer.

    Args:
        input: The table: a Parquet, CSV or JSONL file or folder (local, or s3://, gs://, ...), a Hugging
            Face dataset saved with save_to_disk (PATH, or PATH:SPLIT) or named on the Hub (NAME[:CONFIG]:SPLIT),
            or a flyte.io.DataFrame.
        rows: What each row asks, and where its answer goes.
        run: How the job is chunked, resumed and written (output_dir: where the output Parquet dataset goes).
        settings: The engine, generation and batcher settings (a row's own settings win).
    """
    return await run_table_job(input, rows, run, settings)


@dataclass(frozen=True)
class TableRun:
    """One run of the table job: what it reads, asks and writes, and with which settings.

    Attributes:
        options: What each row asks (its `preprocess` and `postprocess` may be functions).
        run: How the job is chunked, resumed and written.
        settings: The engine, generation and batcher settings.
        noun: What a row is, in messages ("rows", "documents").
    """

    options: TableOptions
    run: RunOptions
    settings: EngineSettings
    noun: str = "rows"

    @property
    def pool(self) -> ReplicaPool:
        """The replicas the chunks go to."""
        return EMBED_POOL if self.options.task_type == "embed" else LLM_POOL

    @property
    def chunk_size(self) -> int:
        return self.options.embedding_chunk_size if self.options.task_type == "embed" else self.run.chunk_size


async def run_table_job(
    table: Any,
    options: TableOptions,
    run: RunOptions,
    settings: EngineSettings,
    *,
    noun: str = "rows",
) -> TableSummary:
    """Run the table job in this task (`run_table`'s body, and a `TableProcessor`'s).

    Raises:
        ValueError: Options that cannot work, a table that cannot be read or has no rows, or output columns
            that would replace the table's own (all before any inference).
        OutputDirError: The output's destination cannot take the table (before any inference).
        RuntimeError: More rows failed than `run.max_failed_fraction` allows (after writing everything), or
            publishing failed (the message names the folder that holds the parts).
    """
    plan = TableRun(options, run, settings, noun)
    job, work = await _start(table, plan)
    fanned = None
    try:
        sender = _sender(plan, job.started)
        fanned = await fan_out(job.chunks(), sender, job.on_chunk, max_in_flight=run.chunks_in_flight(plan.pool))
    finally:
        if fanned is None or not job.counts.done:
            work.discard()  # the run failed as a whole (its error says why), or had nothing to do
    if not job.counts.done:
        raise ValueError(f"{job.source.description}: the table has no rows")
    return await _finish(job, fanned, work, plan)


async def _start(table: Any, plan: TableRun) -> tuple[TableJob, WorkFolder]:
    """The job over the opened table, and its work folder: every check that needs no model, done first."""
    options = plan.options
    options.check()
    destination = check_output(plan.run.output_dir)
    requests = RowRequests(
        options, row_function(options.preprocess, "preprocess"), plan.settings.generation(), options.schema()
    )
    postprocess = row_function(options.postprocess, "postprocess")
    source = table if isinstance(table, TableSource) else await asyncio.to_thread(open_table, table)
    clashes = [name for name in job_columns(options) if name in source.schema.names]
    if clashes:
        raise ValueError(
            f"the table already has the column(s) {', '.join(clashes)}, which the output adds: rename them in the "
            "table, or give another output_column"
        )
    work = WorkFolder("table-", destination)
    parts = TableParts(work.path, options, source.schema.names, postprocess)
    return TableJob(source, requests, parts, chunk_size=plan.chunk_size, noun=plan.noun), work


def _sender(plan: TableRun, started: float) -> Callable[[JobChunk], Awaitable[JobOutcome]]:
    """What `fan_out` calls per chunk: the replica's task (a chunk reused from an earlier run has its failures
    sent again); a chunk whose rows all failed before they were sent is answered here."""
    embedding_model = EmbeddingModel().name if plan.options.task_type == "embed" else ""

    def infer(chunk: JobChunk, cache_salt: str) -> Awaitable[JobOutcome]:
        if isinstance(chunk, EmbeddingChunk):
            return embed_requests(chunk, embedding_model, cache_salt)
        return infer_chunk(chunk, plan.settings, cache_salt)

    retrying = retrying_reused_failures(infer, salt=plan.run.cache_salt(), started=started)

    async def send(chunk: JobChunk) -> JobOutcome:
        if not chunk.items:  # finished_at 0: counted as reused, so no replica's statistics change
            kind = EmbeddingOutcome if isinstance(chunk, EmbeddingChunk) else ChunkOutcome
            return kind(chunk.index, [], ReplicaSnapshot())
        return await retrying(chunk)

    return send


async def _finish(job: TableJob, fanned: FanOutStats, work: WorkFolder, plan: TableRun) -> TableSummary:
    """Join and publish the parts, show the final report, print the summary; fail past the allowed failures."""
    try:
        await asyncio.to_thread(unify_parts, sorted(job.parts.paths))
    except ValueError as error:  # nothing is lost: the parts stay where the message says
        raise ValueError(f"{error}; the parts are in {work.path}") from None
    unpublished: PublishError | None = None
    try:
        where = await publish_parts(sorted(job.parts.paths), work)
    except PublishError as error:  # the parts stay in the work folder, where the summary points
        where, unpublished = str(work.path), error
    summary = _summary(job, fanned, where)
    warning = occupancy_warning(fanned, plan.run, plan.pool) if plan.options.task_type == "generate" else ""
    await job.progress.finish(report_html(summary, fanned.replicas, warning, fanned.started_at or None))
    print(summary_line(summary, plan.noun), flush=True)
    if warning:
        print(f"WARNING: {warning}", flush=True)
    print_report_location()
    if unpublished is not None:
        raise unpublished
    where_failed = f"first: {job.first_failure}; see the error column of {where}"
    check_failures(summary.failed, summary.rows, plan.run.max_failed_fraction, where_failed, plan.noun)
    return summary


def _summary(job: TableJob, fanned: FanOutStats, where: str) -> TableSummary:
    counts = job.counts
    busiest = max(fanned.replicas, key=lambda replica: replica.records, default=None)
    embedded = job.parts.options.task_type == "embed"
    return TableSummary(
        source=job.source.description,
        rows=counts.done,
        answered=counts.done - counts.failed,
        failed=counts.failed,
        reused=counts.reused,
        retried=counts.retried,
        load_time_s=fanned.load_time_s,
        inference_s=fanned.inference_s,
        rows_per_s=fanned.per_second(counts.fresh_answers),
        output_tokens_per_s=fanned.per_second(counts.fresh_tokens),
        output=DataFrame.from_existing_remote(where, format="parquet"),
        occupancy=None if embedded else fanned.occupancy(),
        dimensions=job.parts.dimensions,
        truncated=job.truncated,
        padding_efficiency=busiest.padding_efficiency if embedded and busiest else 0.0,
        avg_batch_size=busiest.avg_batch_size if busiest else 0.0,
    )
