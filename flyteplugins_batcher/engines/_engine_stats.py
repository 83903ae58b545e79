"""EngineStats: what an engine ran, counted where the model runs (`EngineCounters` keeps them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from flyteplugins_batcher import BusyClock
from flyteplugins_batcher.engines._completion import Completion
from flyteplugins_batcher.engines._engine_errors import RequestCancelledError

_NOT_COUNTERS = frozenset({"load_time_s", "loaded_at", "max_num_seqs"})


@dataclass
class EngineStats:
    """Counters an engine keeps across the batches it ran (a snapshot: `engine.stats`).

    Attributes:
        batches: Model calls with at least one valid record (passes, for an engine that splits a batch).
        records: Records that produced a completion.
        failed_records: Records answered with an error instead of a completion (cancelled ones aside).
        cancelled_records: Records their caller cancelled (`RequestCancelledError`): stopped while
            they ran, or never run.
        prompt_tokens: Real prompt tokens across all completions.
        cached_tokens: Of those, the tokens the engine found in its prefix cache and did not compute
            again (vLLM's `num_cached_tokens`); 0 for an engine without a prefix cache.
        completion_tokens: Generated tokens across all completions, and those that cancelled records
            got before the engine stopped them: every token the engine made.
        real_tokens: Non-padding token positions the engine computed over (prompt + generated).
        padded_tokens: All token positions computed over, padding included.
        generate_time_s: Seconds with at least one model call running (overlapping calls count once).
        load_time_s: Seconds the last `load()` took (throughput figures exclude it).
        loaded_at: When the last `load()` ended (epoch seconds; 0.0: not loaded): a run counts only the part of
            the load that fell inside it (a process's earlier load, none of it).
        steps: Engine steps (scheduler iterations) of an engine that schedules sequences itself
            (vLLM, the simulated engine); 0 for the others.
        running_seqs: Sequences running in each step, summed over the steps (`occupancy`'s numerator).
        max_num_seqs: Sequences the engine can run at once (its capacity); 0 where it has none.
        step_time_s: Summed duration of the steps, where the engine knows it: the simulated
            engine's virtual clock; 0 for vLLM, whose busy time is `generate_time_s`.
    """

    batches: int = 0
    records: int = 0
    failed_records: int = 0
    cancelled_records: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    generate_time_s: float = 0.0
    load_time_s: float = 0.0
    loaded_at: float = 0.0
    steps: int = 0
    running_seqs: int = 0
    max_num_seqs: int = 0
    step_time_s: float = 0.0

    @property
    def occupancy(self) -> float | None:
        """Mean running sequences per step, as a share of `max_num_seqs`.

        `None` for an engine without continuous batching (no `max_num_seqs`: Transformers), which has
        no occupancy; 0.0 before its first step for one that has.
        """
        if not self.max_num_seqs:
            return None
        return self.running_seqs / (self.steps * self.max_num_seqs) if self.steps else 0.0

    @property
    def padding_efficiency(self) -> float:
        """Real tokens / padded tokens (1.0 means no compute was spent on padding)."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

    @property
    def completion_tokens_per_s(self) -> float:
        """Generated tokens per second of model time."""
        return self.completion_tokens / self.generate_time_s if self.generate_time_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        """All counters plus the derived rates, as plain numbers."""
        return {
            **asdict(self),
            "padding_efficiency": self.padding_efficiency,
            "completion_tokens_per_s": self.completion_tokens_per_s,
            "occupancy": self.occupancy,
        }

    def since(self, earlier: EngineStats) -> EngineStats:
        """What the engine ran between two snapshots: every counter minus `earlier`'s.

        `load_time_s`, `loaded_at` and `max_num_seqs` are not counters: they are this snapshot's. So the
        occupancy over a window of a run is `later.since(earlier).occupancy`.

        Example:
            ```python
            before = engine.stats
            ...  # the part of the run to measure
            print(engine.stats.since(before).occupancy)
            ```
        """
        differences = {
            item.name: getattr(self, item.name) - getattr(earlier, item.name)
            for item in fields(self)
            if item.name not in _NOT_COUNTERS
        }
        return replace(self, **differences)


class EngineCounters:
    """The counters behind `Engine.stats`, safe to update from any thread.

    The shared pipeline counts batches and records; an engine that splits a batch into passes
    counts those (`count_pass`), and one that schedules sequences itself counts its steps
    (`count_step`).

    Example:
        ```python
        counters = EngineCounters()
        with counters.model_call():
            outcomes = run_model(prompts)
        counters.count_batch(outcomes, counts_as_batch=True)
        print(counters.snapshot().records)
        ```
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = EngineStats()
        self._model_clock = BusyClock()

    def snapshot(self) -> EngineStats:
        """The counts so far, with the model time up to now."""
        with self._lock:
            return replace(self._stats, generate_time_s=self._model_clock.busy_s(time.monotonic()))

    def reset(self) -> None:
        """Start counting afresh; the load (its time and when it ended) and the capacity are kept."""
        with self._lock:
            kept = {name: getattr(self._stats, name) for name in _NOT_COUNTERS}
            self._stats = EngineStats(**kept)
            self._model_clock = BusyClock()

    def loaded_in(self, seconds: float) -> None:
        """The last `load()` took `seconds`, and ended now."""
        with self._lock:
            self._stats.load_time_s, self._stats.loaded_at = seconds, time.time()

    def set_capacity(self, max_num_seqs: int) -> None:
        """The sequences the loaded engine can run at once, known from its load, before any step runs."""
        with self._lock:
            self._stats.max_num_seqs = max_num_seqs

    @contextmanager
    def model_call(self) -> Iterator[None]:
        """Counts model time; overlapping calls (streamed requests) count once."""
        self._model_clock.enter()
        try:
            yield
        finally:
            self._model_clock.exit()

    def count_batch(self, outcomes: Sequence[object], *, counts_as_batch: bool) -> None:
        """One batch's outcomes (a `Completion` or an error per record), and whether it is one model call."""
        completions = [outcome for outcome in outcomes if isinstance(outcome, Completion)]
        cancelled = [outcome for outcome in outcomes if isinstance(outcome, RequestCancelledError)]
        prompt_tokens = sum(completion.prompt_tokens for completion in completions)
        cached_tokens = sum(completion.cached_tokens for completion in completions)
        completion_tokens = sum(completion.completion_tokens for completion in completions)
        cancelled_tokens = sum(outcome.completion_tokens for outcome in cancelled)
        with self._lock:
            stats = self._stats
            stats.batches += counts_as_batch
            stats.records += len(completions)
            stats.failed_records += len(outcomes) - len(completions) - len(cancelled)
            stats.cancelled_records += len(cancelled)
            stats.prompt_tokens += prompt_tokens
            stats.cached_tokens += cached_tokens
            stats.completion_tokens += completion_tokens + cancelled_tokens
            stats.real_tokens += prompt_tokens + completion_tokens
            stats.padded_tokens += prompt_tokens + completion_tokens

    def count_pass(self, padding_positions: int) -> None:
        """One model pass, and the token positions it computed only as padding (engines that pad call this)."""
        with self._lock:
            self._stats.batches += 1
            self._stats.padded_tokens += padding_positions

    def count_step(self, running: int, step_s: float = 0.0) -> None:
        """One engine step with `running` sequences (engines that schedule steps call this, after `set_capacity`)."""
        with self._lock:
            stats = self._stats
            stats.steps += 1
            stats.running_seqs += running
            stats.step_time_s += step_s


class CountedEngine:
    """An engine's statistics over its `EngineCounters` (`Engine` mixes it in: every engine counts what it runs).

    Example:
        ```python
        engine.reset_stats()
        ...
        print(engine.stats.completion_tokens_per_s)
        ```
    """

    _counters: EngineCounters

    @property
    def stats(self) -> EngineStats:
        """A snapshot of what the engine ran since it was built (or `reset_stats()`)."""
        return self._counters.snapshot()

    def reset_stats(self) -> None:
        """Start counting afresh (the load time is kept)."""
        self._counters.reset()
