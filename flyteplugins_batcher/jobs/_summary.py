"""`RunSummary`: what a batch LLM run prints and returns; `ModelRun`: one base model's part of it; `Counts`: the
running counts of a run's requests it is made from.

`prompt_tokens_text` says a run's prompt tokens: how many, the share its engines found in their
prefix caches, and the prefill tokens they computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flyte.io import File


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


@dataclass
class RunSummary:
    """What a batch LLM run prints: counts, accuracy where there is gold, throughput, and where the rest is.

    Throughput counts inference only: `load_time_s` (the slowest replica's model load; the sum of each
    model's, for a run whose models load one after the other) is excluded.
    `reused`: requests answered by an earlier run of the same job (Flyte's cache); `retried`: requests
    an earlier run failed, which this run sent to the engine again.
    `occupancy` says how full the engines were: running sequences per engine step over
    `max_num_seqs`, across the replicas; `None` for engines without continuous batching (Transformers),
    which have no occupancy. `models`: each base model's part (its lines, load and share of the run)
    when the run named several; empty otherwise.
    `prompt_tokens`: prompt tokens of the answers this run computed; `cached_tokens`: of those, the
    ones the engines found in their prefix caches, so that they computed `prompt_tokens - cached_tokens`
    (`prompt_tokens_text` says it).
    """

    source: str
    requests: int
    answered: int
    failed: int
    reused: int
    accuracy: float
    scored: int
    load_time_s: float
    inference_s: float
    requests_per_s: float
    output_tokens_per_s: float
    results: File
    errors: File
    occupancy: float | None = None
    retried: int = 0
    models: list[ModelRun] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0


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
    those found in the engines' prefix caches) are the answers' that this run computed.
    """

    def __init__(self) -> None:
        self.done = self.failed = self.fresh_answers = self.fresh_tokens = self.reused = self.retried = 0
        self.fresh_prompt_tokens = self.fresh_cached_tokens = 0

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
        if fresh and not failed:
            self.fresh_answers += 1
            self.fresh_tokens += completion_tokens
            self.fresh_prompt_tokens += prompt_tokens
            self.fresh_cached_tokens += cached_tokens
