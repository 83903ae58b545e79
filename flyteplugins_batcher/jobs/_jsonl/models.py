"""`ModelLanes`: a JSONL run's base models as its driver sees them: which lines run when, on which settings.

A run that names several base models (`EngineSettings.model`) runs them in waves of
`models_per_replica` (one, by default): the first wave's lines run as the file is read, the later
waves' wait in a spool, and `fan_out` sends a wave's chunks only once the wave before has finished
(its `phase`), so each replica closes a model before it loads the next and loads each model once.
A chunk's settings are its model's (`EngineSettings.for_model`): the replica's engine, and Flyte's
cache, are keyed on them. Each model's lines, load and time make its row of the run's summary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from flyteplugins_batcher.batch_api import BatchRequest, ParsedRequest
from flyteplugins_batcher.engines import model_display_name
from flyteplugins_batcher.jobs._summary import ModelRun
from flyteplugins_batcher.replica import EngineSettings, JobChunk, LineRules, RequestChunk


@dataclass
class _Tally:
    """One model's lines in this run, and when its first chunk left and its last one came back."""

    lines: int = 0
    failed: int = 0
    first_sent: float = 0.0
    last_finished: float = 0.0

    @property
    def wall_s(self) -> float:
        return max(self.last_finished - self.first_sent, 0.0) if self.first_sent else 0.0


class ModelLanes:
    """Which base model each line and chunk runs on, which wave it runs in, and each model's tally.

    Args:
        rules: The run's line rules, with its base models (`LineRules.models`, in the order declared).
        at_once: Models that run side by side (`EngineSettings.models_per_replica`).

    Example:
        ```python
        lanes = ModelLanes(rules, settings.models_per_replica)
        lane = lanes.lane(request)  # its model's reference; None for an embeddings line
        ```
    """

    def __init__(self, rules: LineRules, at_once: int = 1) -> None:
        if not rules.models:
            raise ValueError("ModelLanes needs the run's models in its rules (LineRules.models)")
        self.rules = rules
        self.models = {model.reference: model for model in rules.models}
        self.at_once = max(at_once, 1)
        self._first = rules.models[0]
        self._waves: dict[str, int] = {}  # a model's wave, in the order the file first names the models
        self._chunks: dict[int, str] = {}  # each chunk in the run's hands: its model
        self._tallies: dict[str, _Tally] = {}

    @property
    def several(self) -> bool:
        """Whether the run names more than one base model."""
        return len(self.models) > 1

    def lane(self, request: ParsedRequest) -> str | None:
        """The reference of the model a chat or completion line runs on; `None` for an embeddings line."""
        if not isinstance(request, BatchRequest):
            return None
        model = self.rules.model_of(request) or self._first
        self._waves.setdefault(model.reference, len(self._waves) // self.at_once)
        return model.reference

    def waits(self, lane: str | None) -> bool:
        """Whether a line of this lane waits for a later wave (its model is not among the first `at_once`)."""
        return lane is not None and self._waves[lane] > 0

    def made(self, chunk: JobChunk, lane: str | None) -> None:
        """Note the model of a chunk about to be sent."""
        if lane is not None:
            self._chunks[chunk.index] = lane

    def phase(self, chunk: JobChunk) -> int | None:
        """The chunk's wave (`fan_out`'s `phase`); `None` for an embeddings chunk, which runs whenever."""
        lane = self._chunks.get(chunk.index) if isinstance(chunk, RequestChunk) else None
        return None if lane is None else self._waves[lane]

    def settings(self, chunk: RequestChunk, settings: EngineSettings) -> EngineSettings:
        """The chunk's engine settings (its model's), noting when the model's first chunk left for a replica."""
        lane = self._chunks[chunk.index]
        tally = self._tallies.setdefault(lane, _Tally())
        tally.first_sent = tally.first_sent or time.time()
        return settings.for_model(self.models[lane])

    def finished(self, chunk: JobChunk, failed: int) -> None:
        """Count a finished chunk's lines (`failed` of them failed) for its model."""
        lane = self._chunks.pop(chunk.index, None)
        if lane is None:
            return
        tally = self._tallies.setdefault(lane, _Tally())
        tally.lines += len(chunk.items)
        tally.failed += failed
        tally.last_finished = time.time()

    def runs(self, model_loads: dict[str, float], wall_s: float) -> list[ModelRun]:
        """Each model's row of the summary, in the order they ran (empty for a run of one model).

        Args:
            model_loads: Each model's slowest load in the run, by its replicas' name for it (`FanOutStats`).
            wall_s: The run's wall time, of which each model's is a share.
        """
        if not self.several:
            return []
        rows = []
        for lane in sorted(self._tallies, key=lambda lane: self._waves[lane]):
            model, tally = self.models[lane], self._tallies[lane]
            rows.append(
                ModelRun(
                    model=model.name,
                    requests=tally.lines,
                    failed=tally.failed,
                    load_time_s=model_loads.get(model_display_name(lane or None), 0.0),
                    wall_s=tally.wall_s,
                    share=tally.wall_s / wall_s if wall_s > 0 else 0.0,
                )
            )
        return rows
