"""`RunSummary`: what every job returns and prints (a JSONL file's, gsm8k's, a table's), and its summary line;
`ModelRun`: one base model's part of a run; `Counts`: the running counts of a run's requests it is made from.

`prompt_tokens_text` says a run's prompt tokens: how many, the share its engines found in their
prefix caches, and the prefill tokens they computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from flyte.io import DataFrame, File

from flyteplugins_batcher.jobs._driver import FanOutStats


@dataclass
class ModelRun:
    """One base model's part of a run whose lines named several (`RunSummary.models`).

    Attributes:
        model: Its name, as its result lines carry it.
        requests: Its lines that reached a replica (answered or failed there).
        failed: Those of them that failed.
        load_time_s: Its slowest replica's load in this run (0 when every chunk was reused).
        wall_s: From its first chunk sent to its last one back, its load included.
        share: `wall_s` over the run's wall time.

    Example:
        ```python
        for part in summary.models:
            print(f"{part.model}: {part.requests} lines, load {part.load_time_s:.1f} s, {part.share:.0%} of the run")
        ```
    """

    model: str
    requests: int
    failed: int
    load_time_s: float
    wall_s: float
    share: float


_EMBEDDING_FIELDS = ("dimensions", "truncated", "padding_efficiency", "avg_batch_size")


@dataclass(repr=False)
class RunSummary:
    """What a job run returns and prints: counts, throughput (model loading excluded), and where its output is.

    A JSONL run (`run_batch_file`, `solve_gsm8k`) writes `results` and `errors` files; a table run
    (`run_table`, `embed_corpus`, `TableProcessor`) the `output` table, each row with its answer and
    error. `requests` counts a table's rows.

    Throughput counts inference only: `load_time_s` (the slowest replica's model load; the sum of each
    model's, for a run whose models load one after the other; only what fell inside the run) is excluded.
    `inference_s` and the rates are `None` (printed "not measured") where the run cannot know its inference
    time (a replica's load it cannot place in time); a run that computed answers never reports 0 for them.
    `reused`: requests answered by an earlier run of the same job (Flyte's cache); `retried`: requests
    an earlier run failed, which this run sent to the model again.
    `occupancy` says how full the engines were: running sequences per engine step over
    `max_num_seqs`, across the replicas; `None` for engines without continuous batching (Transformers),
    which have no occupancy, and for embeddings.
    `prompt_tokens`: prompt tokens of the answers this run computed; `cached_tokens`: of those, the
    ones the engines found in their prefix caches, so that they computed `prompt_tokens - cached_tokens`
    (`prompt_tokens_text` says it).
    A JSONL run's `accuracy` over `scored` requests where there is gold (gsm8k), and `models`: each
    base model's part (its lines, load and share of the run) when the run named several; empty otherwise.
    For embeddings, `dimensions` is the vectors' size, `truncated` counts texts cut at the model's
    `max_seq_length`, and `padding_efficiency` and `avg_batch_size` are the busiest replica's.

    Its `repr` (what `flyte run` prints as the run's output) leaves out what the run did not measure or
    what does not apply to it: `None` (no `occupancy` on Transformers), the embeddings' fields on a
    generation run, `accuracy` without gold answers, `models` of a one-model run, `output` of a JSONL run.

    Example:
        ```python
        summary = await run_table(input="questions.parquet", prompt="Answer briefly: {question}")
        table = pandas.read_parquet(summary.output.uri)  # every input column, the answer, the tokens, the error
        print(summary.answered, summary.failed)
        ```
    """

    source: str
    requests: int
    answered: int
    failed: int
    reused: int = 0
    retried: int = 0
    load_time_s: float = 0.0
    inference_s: float | None = 0.0
    requests_per_s: float | None = 0.0
    output_tokens_per_s: float | None = 0.0
    occupancy: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    results: File | None = None
    errors: File | None = None
    accuracy: float = 0.0
    scored: int = 0
    models: list[ModelRun] = field(default_factory=list)
    output: DataFrame | None = None
    dimensions: int = 0
    truncated: int = 0
    padding_efficiency: float = 0.0
    avg_batch_size: float = 0.0

    @classmethod
    def of(cls, source: str, counts: Counts, fanned: FanOutStats, **more: Any) -> RunSummary:
        """The summary of a run's `counts` and what its fan-out saw, with the job's `more` fields."""
        return cls(
            source=source,
            requests=counts.done,
            answered=counts.done - counts.failed,
            failed=counts.failed,
            reused=counts.reused,
            retried=counts.retried,
            load_time_s=fanned.load_time_s,
            inference_s=fanned.inference_s,
            requests_per_s=fanned.per_second(counts.fresh_answers),
            output_tokens_per_s=fanned.per_second(counts.fresh_tokens),
            prompt_tokens=counts.fresh_prompt_tokens,
            cached_tokens=counts.fresh_cached_tokens,
            **({"occupancy": fanned.occupancy()} | more),
        )

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={_short(value)}" for name, value in self._applicable())
        return f"RunSummary({shown})"

    def _applicable(self) -> list[tuple[str, Any]]:
        """The fields this run measured and that apply to it, with their values."""
        left_out = {"models": not self.models, "accuracy": not self.scored, "scored": not self.scored}
        left_out |= dict.fromkeys(_EMBEDDING_FIELDS, not self.dimensions)
        values = ((spec.name, getattr(self, spec.name)) for spec in fields(self))
        return [(name, value) for name, value in values if value is not None and not left_out.get(name, False)]

    @property
    def where(self) -> str:
        """Where its output is: the table, the results and errors files, or the one file of both."""
        if self.output is not None:
            return f"output: {self.output.uri}"
        results, errors = (file.path if file is not None else "" for file in (self.results, self.errors))
        if self.results is not None and self.errors is None:
            return f"results: {results} (errors inline, in input order)"
        return f"results: {results} | errors: {errors}"


def _short(value: Any) -> str:
    """A field's value as the summary's repr shows it: a float to 4 significant digits, a file or table by its place."""
    if isinstance(value, float):
        return f"{value:#.4g}"
    where = getattr(value, "path", None) or getattr(value, "uri", None)
    return repr(where) if isinstance(where, str) else repr(value)


def summary_line(summary: RunSummary, noun: str = "requests") -> str:
    """The one line a run prints: outcome, throughput (model loading excluded) and where its output is."""
    accuracy = f"accuracy {summary.accuracy:.1%} on {summary.scored} scored | " if summary.scored else ""
    reused = f", {summary.reused} reused from an earlier run" if summary.reused else ""
    reused += f", {summary.retried} retried" if summary.retried else ""
    if summary.dimensions:
        batch = f"avg batch {summary.avg_batch_size:.1f}"
        model, prompts = f"{summary.dimensions} dimensions, {summary.truncated} truncated, {batch}", ""
    else:
        occupancy = f", engines {summary.occupancy:.0%} full" if summary.occupancy is not None else ""
        model = f"{measured(summary.output_tokens_per_s, '.0f', 'output tokens/s')}{occupancy}"
        prompts = f"{prompt_tokens_text(summary.prompt_tokens, summary.cached_tokens)} | "
    return (
        f"{accuracy}answered {summary.answered}/{summary.requests} {noun}, {summary.failed} failed{reused} | "
        f"{measured(summary.requests_per_s, '.2f', f'{noun}/s')}, {model} "
        f"({measured(summary.inference_s, '.1f', 's', name='inference')}, model load {summary.load_time_s:.1f} s) | "
        f"{prompts}{summary.where}"
    )


def measured(value: float | None, spec: str, unit: str, *, name: str = "") -> str:
    """A figure (after its `name`, if any) and its unit, or that it was not measured (`None`).

    Example:
        ```python
        assert measured(2.5, ".2f", "rows/s") == "2.50 rows/s"
        assert measured(None, ".2f", "rows/s") == "rows/s not measured"
        assert measured(None, ".1f", "s", name="inference") == "inference not measured"
        ```
    """
    if value is None:
        return f"{name or unit} not measured"
    return f"{name} {value:{spec}} {unit}".lstrip()


def model_line(part: ModelRun) -> str:
    """The line a run that named several base models prints for each: its lines, its load and its share of the run."""
    failed = f", {part.failed} failed" if part.failed else ""
    return (
        f"model {part.model}: {part.requests} requests{failed} | model load {part.load_time_s:.1f} s | "
        f"{part.wall_s:.1f} s, {part.share:.0%} of the run"
    )


def cached_share(prompt_tokens: int, cached_tokens: int) -> float:
    """The share of the prompt tokens an engine found in its prefix cache (0.0 with no prompt tokens)."""
    return cached_tokens / prompt_tokens if prompt_tokens else 0.0


def prompt_tokens_text(prompt_tokens: int, cached_tokens: int) -> str:
    """A run's prompt tokens, the share found in the prefix caches, and the prefill tokens computed.

    Example:
        ```python
        assert prompt_tokens_text(73888, 52388) == "73,888 prompt tokens, 71% cached, 21,500 computed"
        ```
    """
    share = cached_share(prompt_tokens, cached_tokens)
    return f"{prompt_tokens:,} prompt tokens, {share:.0%} cached, {prompt_tokens - cached_tokens:,} computed"


class Counts:
    """Running counts of a run's requests, for its summary and live report.

    The token counts (`fresh_tokens` generated, `fresh_prompt_tokens` read, `fresh_cached_tokens` of
    those found in the engines' prefix caches) are the answers' that this run computed. `computed` and
    `computed_failed`: the requests this run sent to a replica (not reused), and those that failed.
    """

    def __init__(self) -> None:
        self.done = self.failed = self.fresh_answers = self.fresh_tokens = self.reused = self.retried = 0
        self.fresh_prompt_tokens = self.fresh_cached_tokens = self.computed = self.computed_failed = 0

    def count(
        self,
        *,
        failed: bool,
        completion_tokens: int,
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
        fresh: bool = True,
        retried: bool = False,
    ) -> None:
        """One request finished.

        Args:
            failed: It failed.
            completion_tokens: The tokens it generated.
            prompt_tokens: The prompt tokens the engine read for it.
            cached_tokens: Of those, the ones its engine found in its prefix cache.
            fresh: This run computed it (else its answer was reused from an earlier run).
            retried: An earlier run had failed it, and this run sent it to the engine again.
        """
        self.done += 1
        self.failed += failed
        self.reused += not fresh
        self.retried += retried
        self.computed += fresh
        self.computed_failed += fresh and failed
        if fresh and not failed:
            self.fresh_answers += 1
            self.fresh_tokens += completion_tokens
            self.fresh_prompt_tokens += prompt_tokens
            self.fresh_cached_tokens += cached_tokens
