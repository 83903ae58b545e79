"""A run's end: publish its files, show the final report, print the summary, fail past the allowed failures.

How full the replicas' engines were comes back with every chunk (`ReplicaSnapshot`): the run's
summary and report give the engines' occupancy, and when it stayed below `LOW_OCCUPANCY` while
chunks waited in the driver, the run prints one warning naming the setting to raise.
"""

from __future__ import annotations

import logging
from pathlib import Path

from flyte.io import File

from flyteplugins_batcher import size_in_flight
from flyteplugins_batcher.jobs._driver import FanOutStats
from flyteplugins_batcher.jobs._environments import ReplicaPool
from flyteplugins_batcher.jobs._outputs import PublishError, WorkFolder
from flyteplugins_batcher.jobs._report import Progress, final_html, print_report_location
from flyteplugins_batcher.jobs._run_options import RunOptions
from flyteplugins_batcher.jobs._summary import Counts, ModelRun, RunSummary, model_line, summary_line

logger = logging.getLogger("flyteplugins_batcher.jobs._finish")

LOW_OCCUPANCY = 0.8
"""Below this share of its sequence slots, an engine that had work waiting in the driver was starved."""


def check_failures(
    failed: int, total: int, max_failed_fraction: float | None, where: str, noun: str = "requests"
) -> None:
    """Fail the run (non-zero exit) when more requests failed than allowed; the results are written first.

    `None`: no threshold (each failure is in its own line, and the run succeeds, as `vllm run-batch`'s does).

    Raises:
        RuntimeError: More than `max_failed_fraction` of `total` failed, or everything did.
    """
    if not failed or max_failed_fraction is None:
        return
    fraction = failed / total if total else 1.0
    if failed == total or fraction > max_failed_fraction:
        raise RuntimeError(
            f"{failed} of {total} {noun} failed ({fraction:.1%}, allowed: {max_failed_fraction:.1%}); {where}. "
            "Raise max_failed_fraction (the option of that name) to accept failures."
        )


async def finish_run(
    counts: Counts,
    fanned: FanOutStats,
    *,
    source: str,
    work: WorkFolder,
    results: Path,
    errors: Path | None,
    run: RunOptions,
    progress: Progress,
    pool: ReplicaPool | None = None,
    noun: str = "requests",
    accuracy: float = 0.0,
    scored: int = 0,
    models: list[ModelRun] | None = None,
) -> RunSummary:
    """Publish the results and errors files, then close the run (`close_run`): report, summary, warning.

    `errors` `None`: the results file holds every line, its errors inline (vLLM's one output file).
    With the replicas' `pool`, the warning when their engines were starved (`occupancy_warning`);
    with `models` (a run that named several base models), a line per model.

    Raises:
        RuntimeError: Publishing failed (the message names the folder that holds the files), or more
            requests failed than `run.max_failed_fraction` allows (after all of the above).
    """
    summary = RunSummary.of(
        source,
        counts,
        fanned,
        results=File(path=str(results)),
        errors=File(path=str(errors)) if errors is not None else None,
        accuracy=accuracy,
        scored=scored,
        models=list(models or []),
    )
    unpublished: PublishError | None = None
    try:
        published = await work.publish([results] if errors is None else [results, errors])
        summary.results, summary.errors = published[0], published[1] if errors is not None else None
    except PublishError as error:  # the files stay in the work folder, where the summary points
        unpublished = error
    warning = occupancy_warning(fanned, run, pool) if pool is not None else ""
    await close_run(summary, fanned, progress, warning=warning, noun=noun, unpublished=unpublished)
    where = (summary.errors or summary.results or File(path=str(results))).path
    check_failures(summary.failed, summary.requests, run.max_failed_fraction, f"see {where}", noun)
    return summary


async def close_run(
    summary: RunSummary,
    fanned: FanOutStats,
    progress: Progress,
    *,
    warning: str,
    noun: str,
    unpublished: PublishError | None,
) -> None:
    """Show the final report; print the summary line, a line per model (a run of several), the warning if any and
    where the report is.

    Raises:
        PublishError: `unpublished`, the error publishing the run's output met (after all of the above).
    """
    await progress.finish(
        final_html(summary, fanned.replicas, warning, noun=noun, started_at=fanned.started_at or None)
    )
    print(summary_line(summary, noun), flush=True)
    for part in summary.models:
        print(model_line(part), flush=True)
    if warning:
        logger.warning(warning)
        print(f"WARNING: {warning}", flush=True)
    print_report_location()
    if unpublished is not None:
        raise unpublished


def occupancy_warning(fanned: FanOutStats, run: RunOptions, pool: ReplicaPool) -> str:
    """One line naming the setting to raise when the engines ran under `LOW_OCCUPANCY` while chunks waited here.

    The driver's cap binds first when it is below every replica's slots; otherwise the replicas
    take too few calls (or too small ones) to fill their engines. Empty when there is nothing to say.
    """
    occupancy = fanned.occupancy(while_waiting=True)
    # An engine that counted no steps (vLLM with its statistics off) says nothing of its occupancy.
    capacity = max((replica.max_num_seqs for replica in fanned.replicas if replica.engine_steps), default=0)
    if not fanned.held_back or not capacity or occupancy is None or occupancy >= LOW_OCCUPANCY:
        return ""
    cap = run.chunks_in_flight(pool)
    starved = (
        f"the engines were {occupancy:.0%} full (running sequences over max_num_seqs={capacity}) while chunks "
        f"waited in the driver"
    )
    if cap < pool.chunks_in_flight:
        return (
            f"{starved}: raise --max_chunks_in_flight (now {cap}; 0 fills every replica's slots: "
            f"{pool.replicas} replicas x {pool.concurrency} = {pool.chunks_in_flight})"
        )
    setting = f"{pool.prefix}_CONCURRENCY" if pool.prefix else "the replicas' concurrency"
    sized = size_in_flight(capacity, pool.replicas, chunk_size=run.chunk_size).concurrency
    advice = f"size_in_flight gives {sized}" if sized > pool.concurrency else f"try {2 * pool.concurrency}"
    return (
        f"{starved}: raise {setting} (now {pool.concurrency} calls of {run.chunk_size} requests per replica; "
        f"{advice} for max_num_seqs={capacity})"
    )
