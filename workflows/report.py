"""HTML for the workflow's Flyte report: live progress while chunks complete, then the results."""

from __future__ import annotations

import html
from collections.abc import Sequence

from workflows.schema import ReplicaSnapshot, RunResult

_STYLE = """
<style>
  .bl { font-family: system-ui, sans-serif; color: #1f2933; max-width: 980px; }
  .bl h2 { margin: 0.2em 0 0.6em; }
  .bl .cards { display: flex; gap: 12px; flex-wrap: wrap; margin-bottom: 16px; }
  .bl .card { border: 1px solid #d9e2ec; border-radius: 8px; padding: 10px 14px; min-width: 130px; }
  .bl .card .v { font-size: 1.5em; font-weight: 600; }
  .bl .card .k { color: #627d98; font-size: 0.85em; }
  .bl .bar { background: #e4e7eb; border-radius: 6px; height: 18px; overflow: hidden; }
  .bl .bar > div { background: #2f80ed; height: 100%; }
  .bl table { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.9em; }
  .bl td, .bl th { border-bottom: 1px solid #e4e7eb; padding: 4px 10px; text-align: left; vertical-align: top; }
  .bl .ok { color: #1e7b34; } .bl .bad { color: #b42318; }
</style>
"""


def progress_html(done: int, total: int, failed: int, elapsed_s: float, correct: int, scored: int) -> str:
    """The live view: a progress bar and running totals."""
    percent = 100 * done / total if total else 100
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    accuracy = f"{correct / scored:.1%}" if scored else "-"
    return (
        f'{_STYLE}<div class="bl"><h2>gsm8k batch inference: {done}/{total} questions</h2>'
        f'<div class="bar"><div style="width:{percent:.1f}%"></div></div>'
        + _cards(
            [
                ("questions done", f"{done}/{total}"),
                ("failed", str(failed)),
                ("questions/s", f"{rate:.2f}"),
                ("accuracy so far", accuracy),
                ("elapsed", f"{elapsed_s:.1f}s"),
            ]
        )
        + "</div>"
    )


def final_html(result: RunResult, shown_answers: int = 25) -> str:
    """The final view: headline numbers, per-replica batching (with a chart) and sample answers."""
    parts = [
        _STYLE,
        '<div class="bl"><h2>gsm8k batch inference: results</h2>',
        f"<p>Data: {html.escape(result.source)}</p>",
        _cards(
            [
                ("accuracy", f"{result.accuracy:.1%} ({round(result.accuracy * result.scored)}/{result.scored})"),
                ("questions/s", f"{result.questions_per_s:.2f}"),
                ("generated tokens/s", f"{result.tokens_per_s:.0f}"),
                ("answered", f"{result.answered}/{result.questions}"),
                ("failed", str(len(result.failed_questions))),
                ("wall time", f"{result.wall_s:.1f}s"),
            ]
        ),
        "<h3>Replicas</h3>",
        _utilization_chart(result.replicas),
        _replica_table(result.replicas),
    ]
    if result.failed_questions:
        shown = ", ".join(str(index) for index in result.failed_questions[:50])
        parts.append(f'<p class="bad">Failed questions (dataset rows): {shown}</p>')
    parts.append(f"<h3>Answers (first {min(shown_answers, len(result.answers))})</h3>")
    parts.append(_answers_table(result, shown_answers))
    parts.append("</div>")
    return "".join(parts)


def _cards(items: Sequence[tuple[str, str]]) -> str:
    cards = "".join(
        f'<div class="card"><div class="v">{html.escape(value)}</div><div class="k">{html.escape(key)}</div></div>'
        for key, value in items
    )
    return f'<div class="cards">{cards}</div>'


def _utilization_chart(replicas: Sequence[ReplicaSnapshot]) -> str:
    """Horizontal bars: each replica's device utilization, labelled with its average batch size."""
    if not replicas:
        return "<p>No replica reported statistics.</p>"
    row_height, label_width, bar_width = 26, 220, 420
    height = row_height * len(replicas) + 10
    rows = []
    for position, replica in enumerate(replicas):
        y = 5 + position * row_height
        width = max(replica.utilization, 0.0) * bar_width
        rows.append(
            f'<text x="0" y="{y + 15}" font-size="12">{html.escape(replica.replica[:32])}</text>'
            f'<rect x="{label_width}" y="{y}" width="{bar_width}" height="18" fill="#e4e7eb" rx="4"/>'
            f'<rect x="{label_width}" y="{y}" width="{width:.1f}" height="18" fill="#2f80ed" rx="4"/>'
            f'<text x="{label_width + bar_width + 8}" y="{y + 14}" font-size="12">'
            f"{replica.utilization:.0%} busy, avg batch {replica.avg_batch_size:.1f}</text>"
        )
    return (
        f'<svg width="{label_width + bar_width + 220}" height="{height}" role="img" '
        f'aria-label="utilization per replica">{"".join(rows)}</svg>'
    )


def _replica_table(replicas: Sequence[ReplicaSnapshot]) -> str:
    header = (
        "<tr><th>replica</th><th>records</th><th>batches</th><th>avg batch</th><th>avg tokens</th>"
        "<th>utilization</th><th>latency p50 / p99</th><th>padding eff.</th><th>batches by reason</th></tr>"
    )
    rows = "".join(
        f"<tr><td>{html.escape(r.replica)}</td><td>{r.records}</td><td>{r.batches}</td>"
        f"<td>{r.avg_batch_size:.1f}</td><td>{r.avg_batch_tokens:.0f}</td><td>{r.utilization:.1%}</td>"
        f"<td>{r.latency_p50_s:.2f}s / {r.latency_p99_s:.2f}s</td><td>{r.padding_efficiency:.0%}</td>"
        f"<td>{html.escape(', '.join(f'{k} {v}' for k, v in r.batches_by_reason.items() if v))}</td></tr>"
        for r in replicas
    )
    return f"<table>{header}{rows}</table>"


def _answers_table(result: RunResult, limit: int) -> str:
    rows = []
    for answer in result.answers[:limit]:
        verdict = '<span class="ok">correct</span>' if answer.correct else '<span class="bad">wrong</span>'
        if answer.error:
            verdict = f'<span class="bad">failed: {html.escape(answer.error[:120])}</span>'
        rows.append(
            f"<tr><td>{answer.index}</td><td>{html.escape(answer.question[:160])}</td>"
            f"<td>{html.escape(answer.completion[-200:])}</td><td>{_number(answer.predicted)}</td>"
            f"<td>{_number(answer.gold)}</td><td>{verdict}</td></tr>"
        )
    header = "<tr><th>row</th><th>question</th><th>completion (end)</th><th>answer</th><th>gold</th><th></th></tr>"
    return f"<table>{header}{''.join(rows)}</table>"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
