"""`RunSummary`: what a batch LLM run prints and returns."""

from __future__ import annotations

from dataclasses import dataclass

from flyte.io import File


@dataclass
class RunSummary:
    """What a batch LLM run prints: counts, accuracy where there is gold, throughput, and where the rest is.

    Throughput counts inference only: `load_time_s` (the slowest replica's model load) is excluded.
    `reused`: requests answered by an earlier run of the same job (Flyte's cache); `retried`: requests
    an earlier run failed, which this run sent to the engine again.
    `occupancy` says how full the engines were: running sequences per engine step over
    `max_num_seqs`, across the replicas; `None` for engines without continuous batching (Transformers),
    which have no occupancy.
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
