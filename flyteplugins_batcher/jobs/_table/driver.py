"""The table job's driver: open the table, fan its chunks out, write and publish its parts, report.

`run_table_job` is the body of `run_table` and of a `TableProcessor`'s call. It needs Arrow, which
the driver image has and the replicas' images may not: the modules that import it are loaded from
here, when a driver runs, never when `flyteplugins_batcher.jobs` is imported.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from flyte.io import DataFrame

from flyteplugins_batcher.engines import EmbeddingModel
from flyteplugins_batcher.jobs._driver import FanOutStats, fan_out
from flyteplugins_batcher.jobs._environments import EMBED_POOL, LLM_POOL, ReplicaPool
from flyteplugins_batcher.jobs._finish import check_failures, close_run, occupancy_warning
from flyteplugins_batcher.jobs._outputs import PublishError, WorkFolder
from flyteplugins_batcher.jobs._replica_tasks import embed_requests, infer_chunk, pool_chunk
from flyteplugins_batcher.jobs._reruns import retrying_reused_failures
from flyteplugins_batcher.jobs._run_options import RunOptions
from flyteplugins_batcher.jobs._summary import RunSummary
from flyteplugins_batcher.jobs._table.job import TableJob
from flyteplugins_batcher.jobs._table.options import TableOptions, row_function
from flyteplugins_batcher.jobs._table.parts import TableParts, job_columns, unify_parts
from flyteplugins_batcher.jobs._table.publish import check_output, publish_parts
from flyteplugins_batcher.jobs._table.requests import RowRequests
from flyteplugins_batcher.jobs._table.source import TableSource, open_table
from flyteplugins_batcher.replica import (
    ChunkOutcome,
    EmbeddingChunk,
    EmbeddingOutcome,
    EngineSettings,
    JobChunk,
    JobOutcome,
    ReplicaSnapshot,
)


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

    @functools.cached_property
    def classifier(self) -> bool:
        """Whether a classifier given as the model answers the rows (a score or classify task): on the LLM replicas."""
        return self.options.task_type in ("score", "classify") and bool(self.settings.classifier_tasks())

    @property
    def pool(self) -> ReplicaPool:
        """The replicas the chunks go to."""
        return EMBED_POOL if self.options.encoder and not self.classifier else LLM_POOL

    @property
    def chunk_size(self) -> int:
        return self.options.embedding_chunk_size if self.options.encoder else self.run.chunk_size


async def run_table_job(
    table: Any,
    options: TableOptions,
    run: RunOptions,
    settings: EngineSettings,
    *,
    noun: str = "rows",
) -> RunSummary:
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
    if options.task_type == "classify" and not plan.classifier:
        raise ValueError(
            f"task_type='classify' needs a sequence classifier as the model; {plan.settings.model or 'the bundled'} "
            "model is not one (its config names no ...ForSequenceClassification architecture)"
        )
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
    job = TableJob(
        source,
        requests,
        parts,
        chunk_size=plan.chunk_size,
        noun=plan.noun,
        order=plan.run.order,
        window=plan.run.order_window,
    )
    return job, work


def _sender(plan: TableRun, started: float) -> Callable[[JobChunk], Awaitable[JobOutcome]]:
    """What `fan_out` calls per chunk: the replica's task, a reused chunk's failed rows sent again.

    A chunk whose rows all failed before they were sent is answered here, without a replica.
    """
    embedding_model = EmbeddingModel().name if plan.options.encoder else ""

    def infer(chunk: JobChunk, cache_salt: str) -> Awaitable[JobOutcome]:
        if isinstance(chunk, EmbeddingChunk) and plan.classifier:
            return pool_chunk(chunk, plan.settings, cache_salt)
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


async def _finish(job: TableJob, fanned: FanOutStats, work: WorkFolder, plan: TableRun) -> RunSummary:
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
    await close_run(summary, fanned, job.progress, warning=warning, noun=plan.noun, unpublished=unpublished)
    where_failed = f"first: {job.first_failure}; see the error column of {where}"
    check_failures(summary.failed, summary.requests, plan.run.max_failed_fraction, where_failed, plan.noun)
    return summary


def _summary(job: TableJob, fanned: FanOutStats, where: str) -> RunSummary:
    busiest = max(fanned.replicas, key=lambda replica: replica.records, default=None)
    embedded = job.parts.options.encoder
    return RunSummary.of(
        job.source.description,
        job.counts,
        fanned,
        output=DataFrame.from_existing_remote(where, format="parquet"),
        occupancy=None if embedded else fanned.occupancy(),
        dimensions=job.parts.dimensions,
        truncated=job.truncated,
        padding_efficiency=busiest.padding_efficiency if embedded and busiest else 0.0,
        avg_batch_size=busiest.avg_batch_size if busiest else 0.0,
    )
