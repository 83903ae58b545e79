"""flyteplugins-batcher: keep GPUs saturated during batch inference on Flyte 2.

Many concurrent producers feed one in-process `DynamicBatcher` (or `TokenBatcher` for LLMs),
which assembles cost-budgeted batches for a model that is loaded once per process. A drop-in
replacement for `flyte.extras.DynamicBatcher` / `TokenBatcher`: switching is a change of import.

Example:
    ```python
    from flyteplugins_batcher import TokenBatcher

    async with TokenBatcher(inference_fn=engine.generate, token_estimator=engine.estimate_tokens) as batcher:
        answers = await batcher.run(prompts)
    ```
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from flyteplugins_batcher._batcher import DynamicBatcher
from flyteplugins_batcher._errors import (
    BatcherClosedError,
    BatcherError,
    BatcherFailedError,
    BatcherNotRunningError,
    CostBudgetExceededError,
    ProcessFnCancelledError,
    QueueFullError,
    RecordExpiredError,
    ResultCountError,
    UnrecoverableError,
)
from flyteplugins_batcher._measure.observers import BatchObserver
from flyteplugins_batcher._measure.stats import BatchStats, BusyClock
from flyteplugins_batcher._measure.timeline import Timeline
from flyteplugins_batcher._pipeline.invoke import BlockingProcessFnWarning
from flyteplugins_batcher._pipeline.openmp import release_openmp_pool
from flyteplugins_batcher._process.device_monitor import DeviceMonitor
from flyteplugins_batcher._process.sizing import InFlight, size_in_flight
from flyteplugins_batcher._settings import BatcherOptions, BatcherSettings
from flyteplugins_batcher._token_batcher import TokenBatcher
from flyteplugins_batcher._types import (
    Cancellable,
    CostEstimator,
    CostEstimatorFn,
    DispatchReason,
    InferenceFn,
    ProcessFn,
    Prompt,
    SettledOutcome,
    TokenEstimator,
    TokenEstimatorFn,
)
from flyteplugins_batcher._version import __version__

if TYPE_CHECKING:
    from flyteplugins_batcher._process.batched import BatchedFunction, batched
    from flyteplugins_batcher._process.environment import ReplicaStarvationWarning, inference_environment
    from flyteplugins_batcher._process.shared import SharedBatcher

# The helpers for processes shared on Flyte import `flyte` and `async_lru`; they load on first use, so that
# the batcher runs wherever asyncio does (a FastAPI app, a Ray actor, a GPU machine with only torch).
_LAZY = {
    "BatchedFunction": "flyteplugins_batcher._process.batched",
    "batched": "flyteplugins_batcher._process.batched",
    "ReplicaStarvationWarning": "flyteplugins_batcher._process.environment",
    "inference_environment": "flyteplugins_batcher._process.environment",
    "SharedBatcher": "flyteplugins_batcher._process.shared",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BatchObserver",
    "BatchStats",
    "BatchedFunction",
    "BatcherClosedError",
    "BatcherError",
    "BatcherFailedError",
    "BatcherNotRunningError",
    "BatcherOptions",
    "BatcherSettings",
    "BlockingProcessFnWarning",
    "BusyClock",
    "Cancellable",
    "CostBudgetExceededError",
    "CostEstimator",
    "CostEstimatorFn",
    "DeviceMonitor",
    "DispatchReason",
    "DynamicBatcher",
    "InFlight",
    "InferenceFn",
    "ProcessFn",
    "ProcessFnCancelledError",
    "Prompt",
    "QueueFullError",
    "RecordExpiredError",
    "ReplicaStarvationWarning",
    "ResultCountError",
    "SettledOutcome",
    "SharedBatcher",
    "Timeline",
    "TokenBatcher",
    "TokenEstimator",
    "TokenEstimatorFn",
    "UnrecoverableError",
    "__version__",
    "batched",
    "inference_environment",
    "release_openmp_pool",
    "size_in_flight",
]
