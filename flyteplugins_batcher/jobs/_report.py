"""The workflow's Flyte report (HTML): live progress while chunks complete, then the results; and where it is."""

from __future__ import annotations

import asyncio
import html
import logging
import time
from collections.abc import Callable, Sequence

import flyte
import flyte.report

from flyteplugins_batcher.jobs._progress import ProgressLine, ProgressState, format_duration
from flyteplugins_batcher.jobs._report_charts import timeline_section
from flyteplugins_batcher.jobs._report_svg import CHART_WIDTH, PLOT_LEFT, svg, text
from flyteplugins_batcher.jobs._summary import Counts, ModelRun, RunSummary, cached_share
from flyteplugins_batcher.replica import LLMReplica, ReplicaSnapshot

logger = logging.getLogger("flyteplugins_batcher.jobs._report")

STYLE = """
<style>
  .bl { font-family: system-ui, sans-serif; color: #1f2933; max-width: 980px; }
  .bl h2 { margin: 0.2em 0 0.6em; }
  .bl .cards { display: flex; gap: 12px; flex-wrap: wrap; margin-bottom: 16px; }
  .bl .card { border: 1px solid #d9e2ec; border-radius: 8px; padding: 10px 14px; min-width: 130px; }
  .bl .card .v { font-size: 1.5em; font-weight: 600; }
  .bl .card .k { color: #627d98; font-size: 0.85em; }
  .bl .bar { background: #e4e7eb; border-radius: 6px; height: 18px; overflow: hidden; }
  .bl .bar > div { background: #2f80ed; height: 100%; }
  .bl .bar.share { display: inline-block; width: 160px; height: 12px; margin-right: 6px; vertical-align: middle; }
  .bl table { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.85em; display: block; overflow-x: auto; }
  .bl td, .bl th { border-bottom: 1px solid #e4e7eb; padding: 4px 6px; text-align: left; vertical-align: top; }
  .bl .ok { color: #1e7b34; } .bl .bad { color: #b42318; }
  .bl .na, .bl .note { color: #627d98; }
  .bl .note { font-size: 0.85em; margin: -8px 0 16px; }
  .bl h4 { margin: 14px 0 4px; font-size: 0.95em; }
  .bl svg.chart { display: block; max-width: 100%; height: auto; }
</style>
"""


class Progress:
    """A run's progress: the live report, and one line on the terminal (`ProgressLine`), as records finish.

    Two sources move it. Each finished chunk (`update`) gives the run's counts. Between chunks, a ticker
    reads once a second what the replicas in this process finished record by record
    (`LLMReplica.live_records`): under flyte's local runner they run here, so the line moves per record,
    with rates measured over the time records were in flight. On a cluster the replicas are other
    processes, nothing is counted here, and the line moves per chunk. The ticker also gives logs their
    heartbeat at the configured interval, chunk or no chunk. Both views are throttled: each report flush
    rewrites the report, and the line follows `ProgressLine`'s rules.

    Args:
        title: What the run does.
        total: Requests in the run (or read so far, while `total_known` is False).
        min_interval_s: Least time between two report flushes.
        noun: What the run counts, for the line.
        total_known: Whether `total` is final (set it once a streamed input has been read through).

    Example:
        ```python
        progress = Progress("gsm8k", total=32, noun="questions")  # in the driver's task: the ticker starts
        await progress.update(counts)  # as each chunk finishes
        await progress.finish(final_html(summary, replicas))
        ```
    """

    def __init__(
        self, title: str, total: int, min_interval_s: float = 0.5, noun: str = "requests", total_known: bool = True
    ) -> None:
        self.title = title
        self.total = total
        self.total_known = total_known
        self.line = ProgressLine(noun)
        self._min_interval_s = min_interval_s
        self._last_flush = 0.0
        self._counts = Counts()
        self._live_from = LLMReplica.live_records()
        self._ticked_done = 0
        self._ticker = _start_ticker(self._tick)

    def state(self) -> ProgressState:
        """The run's state now: its finished chunks' counts, and the records finished in this process since."""
        counts, live = self._counts, LLMReplica.live_records().since(self._live_from)
        beyond = max(live.finished - counts.computed, 0)  # finished here, in chunks not back yet
        failed = counts.failed + max(live.failed - counts.computed_failed, 0)
        tokens = max(counts.fresh_tokens, live.completion_tokens)
        rates = (live.records_per_s(), live.tokens_per_s()) if live.finished else None
        return self.line.state(counts.done + beyond, failed, self.total, self.total_known, tokens=tokens, rates=rates)

    async def update(self, counts: Counts, note: str = "") -> None:
        """A chunk finished: show how far the run is (the report at most every `min_interval_s`, and at the end)."""
        self._counts = counts
        state = self.state()
        self.line.show(state)
        now = time.monotonic()
        if now - self._last_flush < self._min_interval_s and state.done < self.total:
            return
        self._last_flush = now
        percent = 100 * state.done / self.total if self.total else 100
        eta = state.eta_s()
        cards = [("done", f"{state.done}/{self.total}"), ("failed", str(state.failed))]
        cards.append(("per second", f"{state.rate:.2f}"))
        if eta is not None:
            cards.append(("ETA", format_duration(eta)))
        if note:
            cards.append(("", note))
        await _replace(
            f'{STYLE}<div class="bl"><h2>{html.escape(self.title)}: {state.done}/{self.total}</h2>'
            f'<div class="bar"><div style="width:{percent:.1f}%"></div></div>{cards_html(cards)}</div>'
        )

    async def finish(self, final: str) -> None:
        """Show the final view, and end the terminal line."""
        self.close()
        self.line.close(self.state())
        await _replace(final)

    def close(self) -> None:
        """Stop the ticker (idempotent; `finish` does it)."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def _tick(self) -> None:
        state = self.state()
        # A line per tick only where it is rewritten in place or throttled anyway; with no interval (logs that
        # want every update), only when a request finished.
        if state.done != self._ticked_done or self.line.on_terminal or self.line.interval_s >= TICK_S:
            self._ticked_done = state.done
            self.line.show(state)


TICK_S = 1.0
"""How often the ticker reads the records finished in this process (the line itself is throttled further)."""


def _start_ticker(tick: Callable[[], None]) -> asyncio.Task[None] | None:
    """Call `tick` every `TICK_S` until the task that started it ends (none outside an event loop)."""
    try:
        owner = asyncio.current_task()
    except RuntimeError:
        return None
    if owner is None:
        return None

    async def ticking() -> None:
        while not owner.done():
            await asyncio.sleep(TICK_S)
            try:
                tick()
            except Exception as exc:  # the line is a view; it must never fail the run
                logger.warning("could not show the progress: %s", exc)
                return

    return asyncio.get_running_loop().create_task(ticking(), name="progress-ticker")


def report_location() -> str:
    """Where flyte writes this task's report: `report.html` in the task's output folder (a file, in `--local` runs).

    Empty outside a Flyte task.
    """
    context = flyte.ctx()
    if context is None or not context.output_path:
        return ""
    return f"{context.output_path.rstrip('/')}/report.html"


def print_report_location() -> None:
    """Print the line that says where the report is (nothing outside a Flyte task)."""
    where = report_location()
    if where:
        print(f"report: {where}", flush=True)


async def _replace(page: str) -> None:
    try:
        await flyte.report.replace.aio(page, do_flush=True)
    except Exception as exc:  # the report is a view; it must never fail the run
        logger.warning("could not update the report: %s", exc)


def final_html(
    result: RunSummary,
    replicas: Sequence[ReplicaSnapshot],
    warning: str = "",
    *,
    noun: str = "requests",
    started_at: float | None = None,
) -> str:
    """The final view: headline numbers, where the output is, where the time went, each replica's batching and device.

    Args:
        result: The run's summary.
        replicas: Each replica's latest snapshot.
        warning: A line to show in red (empty: none).
        noun: What the run counts ("requests", "rows", ...).
        started_at: When the run started (epoch seconds), where the charts begin; by default the run's
            wall time (`load_time_s + inference_s`) before the replicas' last batch.
    """
    reused = (
        f"<p>{result.reused} {noun} were answered by an earlier run; {result.retried} that it had failed were "
        "sent to the engine again.</p>"
        if result.reused or result.retried
        else ""
    )
    return "".join(
        [
            STYLE,
            f'<div class="bl"><h2>{"Table" if result.output is not None else "Batch inference"}: results</h2>',
            f"<p>Data: {html.escape(result.source)}</p>",
            cards_html(_result_cards(result)),
            f'<p class="bad">{html.escape(warning)}</p>' if warning else "",
            reused,
            _output_html(result),
            models_html(result.models),
            replicas_html(replicas),
            timeline_section(replicas, result.load_time_s + (result.inference_s or 0.0), started_at)
            if replicas
            else "",
            "</div>",
        ]
    )


def _result_cards(result: RunSummary) -> list[tuple[str, str]]:
    """The final report's cards: accuracy (where scored), answered, failed, throughput, the model's figures, time."""
    share = cached_share(result.prompt_tokens, result.cached_tokens)
    cards = []
    if result.scored:
        cards.append(("accuracy", f"{result.accuracy:.1%} ({round(result.accuracy * result.scored)}/{result.scored})"))
    cards += [
        ("answered", f"{result.answered}/{result.requests}"),
        ("failed", str(result.failed)),
        ("per second (inference)", _figure(result.requests_per_s, ".2f")),
    ]
    if result.dimensions:
        cards += [("dimensions", str(result.dimensions)), ("padding efficiency", f"{result.padding_efficiency:.0%}")]
    else:
        cards += [
            ("output tokens/s", _figure(result.output_tokens_per_s, ".0f")),
            ("prompt tokens", f"{result.prompt_tokens:,}"),
            ("found in prefix cache", f"{share:.0%}"),
            ("prefill tokens computed", f"{result.prompt_tokens - result.cached_tokens:,}"),
        ]
    cards += [("model load", f"{result.load_time_s:.1f}s"), ("inference", _figure(result.inference_s, ".1f", "s"))]
    return cards + ([("engine occupancy", f"{result.occupancy:.0%}")] if result.occupancy is not None else [])


def _figure(value: float | None, spec: str, unit: str = "") -> str:
    """A card's figure, or "not measured" (`None`)."""
    return "not measured" if value is None else f"{value:{spec}}{unit}"


def _output_html(result: RunSummary) -> str:
    """Where the output is: the table, the results and errors files, or the one file of both."""
    if result.output is not None:
        return f"<p>Output: <code>{html.escape(str(result.output.uri))}</code></p>"
    results, errors = (file.path if file is not None else "" for file in (result.results, result.errors))
    if result.results is not None and result.errors is None:  # vLLM's one output file
        return f"<p>Output: <code>{html.escape(str(results))}</code> (errors inline, in input order)</p>"
    return (
        f"<p>Results: <code>{html.escape(str(results))}</code><br>Errors: <code>{html.escape(str(errors))}</code></p>"
    )


def models_html(models: Sequence[ModelRun]) -> str:
    """A run that named several base models: each one's lines, load and time, its share of the run as a bar."""
    if not models:
        return ""
    header = (
        "<tr><th>model</th><th>requests</th><th>failed</th><th>load</th><th>time</th><th>share of the run</th></tr>"
    )
    rows = "".join(
        f"<tr><td>{html.escape(part.model)}</td><td>{part.requests}</td><td>{part.failed}</td>"
        f"<td>{part.load_time_s:.1f}s</td><td>{part.wall_s:.1f}s</td>"
        f'<td><div class="bar share"><div style="width:{min(max(part.share, 0.0), 1.0):.1%}"></div></div>'
        f"{part.share:.0%}</td></tr>"
        for part in models
    )
    note = (
        '<p class="note">The models took turns on the replicas (models_per_replica at a time), each loaded once '
        "per replica and closed before the next loaded; a model's time counts from its first chunk sent to its "
        "last one back, its load included.</p>"
    )
    return f"<h3>Models</h3><table>{header}{rows}</table>{note}"


def replicas_html(replicas: Sequence[ReplicaSnapshot]) -> str:
    """Each replica's utilization bar, its table row, and one note on a GPU that could not be asked."""
    return "".join(
        ["<h3>Replicas</h3>", _utilization_chart(replicas), _replica_table(replicas), _device_note(replicas)]
    )


def cards_html(items: Sequence[tuple[str, str]]) -> str:
    cards = "".join(
        f'<div class="card"><div class="v">{html.escape(value)}</div><div class="k">{html.escape(key)}</div></div>'
        for key, value in items
    )
    return f'<div class="cards">{cards}</div>'


def _utilization_chart(replicas: Sequence[ReplicaSnapshot]) -> str:
    """Horizontal bars: each replica's share of its active time busy, labelled with its GPU's and its average batch."""
    if not replicas:
        return "<p>No replica reported statistics.</p>"
    row_height, bar_width = 26, 440
    label_x = PLOT_LEFT + bar_width + 8
    rows = []
    for position, replica in enumerate(replicas):
        y = 5 + position * row_height
        width = min(max(replica.utilization, 0.0), 1.0) * bar_width
        rows.append(
            text(PLOT_LEFT - 8, y + 13, replica.replica, room=PLOT_LEFT - 16, anchor="end")
            + f'<rect x="{PLOT_LEFT}" y="{y}" width="{bar_width}" height="18" fill="#e4e7eb" rx="4"/>'
            f'<rect class="utilization" x="{PLOT_LEFT}" y="{y}" width="{width:.1f}" height="18" fill="#2f80ed" rx="4"/>'
            + text(
                label_x,
                y + 13,
                f"{replica.utilization:.0%} busy, GPU {_device(replica)}, avg batch {replica.avg_batch_size:.1f}",
                room=CHART_WIDTH - label_x - 4,
            )
        )
    return svg("utilization", row_height * len(replicas) + 10, "".join(rows), "utilization per replica")


def _replica_table(replicas: Sequence[ReplicaSnapshot]) -> str:
    header = (
        "<tr><th>replica</th><th>model</th><th>load</th><th>records</th><th>batches</th><th>avg batch</th>"
        "<th>avg tokens</th><th>busy (batcher)</th><th>GPU (NVML)</th><th>latency p50 / p99</th>"
        "<th>padding eff.</th><th>engine occupancy</th><th>batches by reason</th></tr>"
    )
    rows = "".join(
        f"<tr><td>{html.escape(r.replica)}</td><td>{html.escape(r.model)}</td><td>{r.load_time_s:.1f}s</td>"
        f"<td>{r.records}</td><td>{r.batches}</td>"
        f"<td>{r.avg_batch_size:.1f}</td><td>{r.avg_batch_tokens:.0f}</td><td>{r.utilization:.1%}</td>"
        f"{_device_cell(r)}"
        f"<td>{r.latency_p50_s:.2f}s / {r.latency_p99_s:.2f}s</td><td>{r.padding_efficiency:.0%}</td>"
        f"<td>{_occupancy(r)}</td>"
        f"<td>{html.escape(', '.join(f'{k} {v}' for k, v in r.batches_by_reason.items() if v))}</td></tr>"
        for r in replicas
    )
    return f"<table>{header}{rows}</table>"


def _occupancy(replica: ReplicaSnapshot) -> str:
    if not replica.max_num_seqs or not replica.engine_steps:
        return "n/a"
    return f"{replica.occupancy:.0%} of {replica.max_num_seqs} seqs over {replica.engine_steps} steps"


def _device(replica: ReplicaSnapshot) -> str:
    """The GPU's own utilization, or "n/a" where it could not be asked (`_device_note` says why)."""
    return f"{replica.device_utilization:.0%}" if replica.device_utilization >= 0 else "n/a"


def _device_cell(replica: ReplicaSnapshot) -> str:
    # "na": greyed, and told apart from the other columns' n/a
    return f"<td>{_device(replica)}</td>" if replica.device_utilization >= 0 else '<td class="na">n/a</td>'


def _device_note(replicas: Sequence[ReplicaSnapshot]) -> str:
    """One line under the table on why the GPU column says n/a (each distinct reason once); empty when it does not."""
    reasons = dict.fromkeys(
        replica.device_note.removeprefix("not available: ") or "the replica could not ask its GPU"
        for replica in replicas
        if replica.device_utilization < 0
    )
    if not reasons:
        return ""
    return f'<p class="note">GPU (NVML) n/a: {html.escape("; ".join(reasons))}.</p>'
