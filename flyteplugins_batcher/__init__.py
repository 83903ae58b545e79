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

from flyteplugins_batcher._batched import BatchedFunction, batched
from flyteplugins_batcher._batcher import DynamicBatcher
from flyteplugins_batcher._device_monitor import DeviceMonitor, DeviceUtilization
from flyteplugins_batcher._environment import ReplicaStarvationWarning, inference_environment
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
from flyteplugins_batcher._histogram import Distribution
from flyteplugins_batcher._invoke import BlockingProcessFnWarning
from flyteplugins_batcher._lifecycle import BatcherState
from flyteplugins_batcher._observers import BatchObserver, SettledOutcome
from flyteplugins_batcher._openmp import release_openmp_pool
from flyteplugins_batcher._records import (
    Cancellable,
    CostEstimator,
    CostEstimatorFn,
    InferenceFn,
    ProcessFn,
    Prompt,
    TokenEstimator,
    TokenEstimatorFn,
)
from flyteplugins_batcher._settings import BatcherOptions, BatcherSettings, Grouping, OnError, Oversized
from flyteplugins_batcher._shared import SharedBatcher
from flyteplugins_batcher._sizing import InFlight, size_in_flight
from flyteplugins_batcher._stats import BatchStats, DispatchReason
from flyteplugins_batcher._timeline import Timeline
from flyteplugins_batcher._token_batcher import TokenBatcher
from flyteplugins_batcher._version import __version__

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
    "BatcherState",
    "BlockingProcessFnWarning",
    "Cancellable",
    "CostBudgetExceededError",
    "CostEstimator",
    "CostEstimatorFn",
    "DeviceMonitor",
    "DeviceUtilization",
    "DispatchReason",
    "Distribution",
    "DynamicBatcher",
    "Grouping",
    "InFlight",
    "InferenceFn",
    "OnError",
    "Oversized",
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
