"""Engine steps and occupancy from vLLM's own scheduler statistics (imported only once vLLM is).

vLLM hands every stat logger, once per engine step, its scheduler's `SchedulerStats` (requests
running after the step) and the step's `IterationStats` (among them the requests that finished in
it). `StepRecorder` turns each into one `EngineCounters.count_step`: the sequences that ran in the step
are those still running plus those that just finished (at most `max_num_seqs`). A request ended by a
stop string is finished by vLLM's front end while its engine still counts it running, so it is
counted twice in its last step: at most one sequence-step per such request.

`AsyncLLM` (stream mode) takes the recorder as a custom stat logger, which turns vLLM's statistics
on without its periodic log lines. The offline `vllm.LLM` (batch mode) takes no stat loggers, so
the recorder joins its engine's logger list (an internal of vLLM 0.10+; where it is missing the
engine warns once and reports no steps). Cost: one call of a few microseconds per step, against
steps of several milliseconds on a GPU; vLLM's own statistics (which `vllm serve` keeps on by
default) run in its front-end process, beside the engine-core process that drives the GPU.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

logger = logging.getLogger("flyteplugins_batcher")

CountStep = Callable[[int], None]
"""Receives the running sequences of one step (the engine set its capacity at load)."""


class StepRecorder(StatLoggerBase):
    """A vLLM stat logger that counts engine steps and the sequences running in each.

    Args:
        vllm_config: The engine's configuration (its `max_num_seqs` bounds a step's running sequences).
        engine_index: Which data-parallel engine it records (0 here).
        count_step: Receives each step.

    Example:
        ```python
        llm = AsyncLLM.from_engine_args(args, stat_loggers=[StepRecorder.factory(counters.count_step)])
        ```
    """

    def __init__(self, vllm_config: Any, engine_index: int = 0, *, count_step: CountStep) -> None:
        self.capacity = int(vllm_config.scheduler_config.max_num_seqs)
        self.engine_index = engine_index
        self._count_step = count_step
        self._broken = False

    @classmethod
    def factory(cls, count_step: CountStep) -> Callable[[Any, int], StepRecorder]:
        """What `AsyncLLM(stat_loggers=[...])` takes: builds a recorder per engine."""
        return functools.partial(cls, count_step=count_step)

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        if scheduler_stats is None or self._broken:  # not a step (vLLM sends none with stats off)
            return
        try:
            finished = len(iteration_stats.finished_requests) if iteration_stats is not None else 0
            running = min(scheduler_stats.num_running_reqs + finished, self.capacity)
        except Exception as error:  # vLLM calls these statistics unstable; an error here would stop its output handling
            self._broken = True
            logger.warning("vllm: cannot read engine steps from its statistics (%r); occupancy stops counting", error)
            return
        if running:  # a step that only cleaned up finished requests ran nothing
            self._count_step(running)

    def log_engine_initialized(self) -> None:
        """Nothing to log: the recorder only counts."""


def record_offline_steps(llm: Any, count_step: CountStep) -> None:
    """Attach a `StepRecorder` to a `vllm.LLM` built with `disable_log_stats=False`."""
    llm_engine = getattr(llm, "llm_engine", None)
    loggers = getattr(getattr(llm_engine, "logger_manager", None), "stat_loggers", None)
    if not isinstance(loggers, list):
        logger.warning("vllm: cannot read engine steps (unknown vLLM internals); occupancy will read 0")
        return
    loggers.append(StepRecorder(llm_engine.vllm_config, 0, count_step=count_step))
