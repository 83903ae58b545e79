"""EngineStats: what an engine ran, counted where the model runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class EngineStats:
    """Counters an engine keeps across the batches it ran (a snapshot: `engine.stats`).

    Attributes:
        batches: Model calls with at least one valid record (passes, for an engine that splits a batch).
        records: Records that produced a completion.
        failed_records: Records answered with an error instead of a completion.
        prompt_tokens: Real prompt tokens across all completions.
        completion_tokens: Generated tokens across all completions.
        real_tokens: Non-padding token positions the engine computed over (prompt + generated).
        padded_tokens: All token positions computed over, padding included.
        generate_time_s: Seconds with at least one model call running (overlapping calls count once).
        load_time_s: Seconds the last `load()` took (throughput figures exclude it).
    """

    batches: int = 0
    records: int = 0
    failed_records: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    generate_time_s: float = 0.0
    load_time_s: float = 0.0

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
        }
