"""The GPU worker environment: reusable replicas that each host one model and one shared batcher."""

from __future__ import annotations

import logging
import warnings
from datetime import timedelta
from typing import Any

import flyte

logger = logging.getLogger("flyteplugins_batcher")

Replicas = int | tuple[int, int]


class ReplicaStarvationWarning(UserWarning):
    """One replica running one task at a time: nothing can be batched across tasks."""


def inference_environment(
    name: str,
    *,
    image: flyte.Image | str = "auto",
    gpu: str | int | None = "L4:1",
    replicas: Replicas = 2,
    concurrency: int = 10,
    cpu: int | str = 4,
    memory: str = "16Gi",
    idle_ttl: int | timedelta = 300,
    scaledown_ttl: int | timedelta = 60,
    env_vars: dict[str, str] | None = None,
    **environment_options: Any,
) -> flyte.TaskEnvironment:
    """Build a reusable GPU worker `TaskEnvironment` for batched inference, validated up front.

    Each replica is one long-lived container running one Python process: the model and the
    batcher live there once (see `SharedBatcher`), and up to `concurrency` task invocations run
    at once on it, all feeding the same batcher. Tasks on it must be `async def` when
    `concurrency > 1` (flyte rejects a plain `def` task at decoration time).

    Args:
        name: Environment name (snake_case or kebab-case).
        image: The worker image (a `flyte.Image`, an image URI, or "auto").
        gpu: Accelerator request such as `"L4:1"` or `"A100:2"`, a GPU count, or `None` for CPU.
        replicas: Replicas to keep (int), or an autoscaling range `(min, max)`.
        concurrency: Concurrent task invocations per replica; the batcher's traffic.
        cpu: CPU request per replica (the producers' loading and pre-processing runs here too).
        memory: Memory request per replica.
        idle_ttl: How long idle replicas live before the environment scales to zero.
        scaledown_ttl: How long one idle replica lives before it is removed.
        env_vars: Environment variables for the replicas (settings such as Hugging Face's belong in the image).
        **environment_options: Any other `flyte.TaskEnvironment` keyword (secrets, depends_on...).

    Raises:
        ValueError: On settings that cannot work (no replica, concurrency below 1).

    Example:
        ```python
        gpu_env = inference_environment("llm_worker", image=GPU_SPEC.resolve(), gpu="L4:1", replicas=2, concurrency=10)
        ```
    """
    _validate_replicas(replicas)
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    max_replicas = replicas if isinstance(replicas, int) else replicas[1]
    if max_replicas == 1 and concurrency == 1:
        warnings.warn(
            f"{name}: one replica with concurrency=1 runs one task at a time, so the batcher only ever sees "
            "one task's records; raise concurrency (tasks must be async) to batch across tasks",
            ReplicaStarvationWarning,
            stacklevel=2,
        )
    return flyte.TaskEnvironment(
        name=name,
        image=image,
        resources=flyte.Resources(cpu=cpu, memory=memory, gpu=gpu) if gpu else flyte.Resources(cpu=cpu, memory=memory),
        reusable=flyte.ReusePolicy(
            replicas=replicas, concurrency=concurrency, idle_ttl=idle_ttl, scaledown_ttl=scaledown_ttl
        ),
        env_vars=dict(env_vars or {}),
        **environment_options,
    )


def _validate_replicas(replicas: Replicas) -> None:
    if isinstance(replicas, bool) or not isinstance(replicas, (int, tuple)):
        raise ValueError(f"replicas must be an int or a (min, max) tuple, got {replicas!r}")
    if isinstance(replicas, int):
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1 (a replica hosts the model), got {replicas}")
        return
    if len(replicas) != 2 or not all(isinstance(bound, int) for bound in replicas):
        raise ValueError(f"replicas as a range must be (min, max) integers, got {replicas!r}")
    low, high = replicas
    if high < 1:
        raise ValueError(f"replicas=(min, max) needs max >= 1 (a replica hosts the model), got {replicas}")
    if not 0 <= low <= high:
        raise ValueError(f"replicas=(min, max) needs 0 <= min <= max, got {replicas}")
