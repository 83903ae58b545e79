"""`TableSummary`: what a table job prints and returns, and its final report."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from flyte.io import DataFrame

from flyteplugins_batcher.jobs._report import STYLE, cards_html, headline_cards, prompt_cards, replicas_html
from flyteplugins_batcher.jobs._report_charts import timeline_section
from flyteplugins_batcher.jobs._summary import prompt_tokens_text
from flyteplugins_batcher.replica import ReplicaSnapshot


@dataclass
class TableSummary:
    """What a table job returns: counts, throughput (model loading excluded), and the output table.

    `reused`: rows answered by an earlier run of the same job (Flyte's cache); `retried`: rows an
    earlier run failed, which this run sent to the model again. `occupancy`: how full the LLM
    engines were (None for engines without continuous batching, and for embeddings). For
    embeddings, `dimensions` is the vectors' size, `truncated` counts texts cut at the model's
    `max_seq_length`, and `padding_efficiency` and `avg_batch_size` are the busiest replica's.
    `prompt_tokens` and `cached_tokens`: as `RunSummary`'s (the LLM's prompt tokens for the rows this
    run computed, and those its engines found in their prefix caches).

    Example:
        ```python
        summary = await run_table(input="questions.parquet", prompt="Answer briefly: {question}")
        table = pandas.read_parquet(summary.output.uri)  # every input column, the answer, the tokens, the error
        print(summary.answered, summary.failed)
        ```
    """

    source: str
    rows: int
    answered: int
    failed: int
    reused: int
    retried: int
    load_time_s: float
    inference_s: float
    rows_per_s: float
    output_tokens_per_s: float
    output: DataFrame
    occupancy: float | None = None
    dimensions: int = 0
    truncated: int = 0
    padding_efficiency: float = 0.0
    avg_batch_size: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0


def summary_line(summary: TableSummary, noun: str = "rows") -> str:
    """The one line a table run prints: outcome, throughput (model loading excluded) and where the output is."""
    reused = f", {summary.reused} reused from an earlier run" if summary.reused else ""
    reused += f", {summary.retried} retried" if summary.retried else ""
    if summary.dimensions:
        batch = f"avg batch {summary.avg_batch_size:.1f}"
        model = f"{summary.dimensions} dimensions, {summary.truncated} truncated, {batch}"
    else:
        occupancy = f", engines {summary.occupancy:.0%} full" if summary.occupancy is not None else ""
        model = f"{summary.output_tokens_per_s:.0f} output tokens/s{occupancy}"
    prompts = "" if summary.dimensions else f"{prompt_tokens_text(summary.prompt_tokens, summary.cached_tokens)} | "
    return (
        f"answered {summary.answered}/{summary.rows} {noun}, {summary.failed} failed{reused} | "
        f"{summary.rows_per_s:.2f} {noun}/s, {model} "
        f"(inference {summary.inference_s:.1f} s, model load {summary.load_time_s:.1f} s) | "
        f"{prompts}output: {summary.output.uri}"
    )


def report_html(
    summary: TableSummary, replicas: Sequence[ReplicaSnapshot], warning: str = "", started_at: float | None = None
) -> str:
    """The final report: headline numbers, where the output is, each replica's batching, and where the time went."""
    cards = [
        *headline_cards(summary.answered, summary.rows, summary.failed, summary.rows_per_s),
        ("model load", f"{summary.load_time_s:.1f}s"),
        ("inference", f"{summary.inference_s:.1f}s"),
    ]
    if summary.dimensions:
        cards += [("dimensions", str(summary.dimensions)), ("padding efficiency", f"{summary.padding_efficiency:.0%}")]
    else:
        cards += [("output tokens/s", f"{summary.output_tokens_per_s:.0f}")]
        cards += prompt_cards(summary.prompt_tokens, summary.cached_tokens)
    if summary.occupancy is not None:
        cards.append(("engine occupancy", f"{summary.occupancy:.0%}"))
    reused = f"<p>{summary.reused} rows were answered by an earlier run.</p>" if summary.reused else ""
    return "".join(
        [
            f'{STYLE}<div class="bl"><h2>Table: results</h2><p>Data: {html.escape(summary.source)}</p>',
            cards_html(cards),
            f'<p class="bad">{html.escape(warning)}</p>' if warning else "",
            f"{reused}<p>Output: <code>{html.escape(str(summary.output.uri))}</code></p>",
            replicas_html(replicas),
            timeline_section(replicas, summary.load_time_s + summary.inference_s, started_at) if replicas else "",
            "</div>",
        ]
    )
