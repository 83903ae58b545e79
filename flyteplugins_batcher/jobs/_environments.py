"""Flyte environments of the workflows: pools of reusable replicas sized from environment variables, and drivers.

Replicas, concurrent calls per replica and the GPU type are environment-level settings, fixed when
a workflow module is imported: set `<PREFIX>_REPLICAS`, `<PREFIX>_CONCURRENCY` and `<PREFIX>_GPU`
(for example `A100:1`, or `none` for CPU replicas) before `flyte run` / `flyte deploy`. The LLM
replicas read `BATCH_LLM_*`, the embedding replicas `EMBED_*`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import flyte

from flyteplugins_batcher import inference_environment
from flyteplugins_batcher.images import driver_image


@dataclass(frozen=True)
class ReplicaPool:
    """The reusable replicas of one workload: how many, how many concurrent calls each, on which GPU.

    Attributes:
        replicas: Replicas kept running.
        concurrency: Task calls running at once on one replica (they feed its one batcher).
        gpu: The accelerator per replica (`"L4:1"`), or `None` for CPU replicas.
        prefix: The environment variables' prefix these settings are read from (for messages).

    Example:
        ```python
        pool = ReplicaPool.from_environment("BATCH_LLM", replicas=2, concurrency=10)
        gpu_env = pool.environment("batch_llm_gpu", image=gpu_image)
        ```
    """

    replicas: int
    concurrency: int
    gpu: str | None
    prefix: str = ""

    @classmethod
    def from_environment(cls, prefix: str, *, replicas: int, concurrency: int, gpu: str = "L4:1") -> ReplicaPool:
        """`<prefix>_REPLICAS`, `<prefix>_CONCURRENCY` and `<prefix>_GPU` (`none`: CPU), else the defaults given."""
        gpu = os.environ.get(f"{prefix}_GPU", gpu)
        return cls(
            replicas=int(os.environ.get(f"{prefix}_REPLICAS", replicas)),
            concurrency=int(os.environ.get(f"{prefix}_CONCURRENCY", concurrency)),
            gpu=None if gpu.lower() == "none" else gpu,
            prefix=prefix,
        )

    @property
    def chunks_in_flight(self) -> int:
        """Calls that fill every replica's slots: `replicas x concurrency`."""
        return self.replicas * self.concurrency

    def environment(self, name: str, *, image: flyte.Image | str) -> flyte.TaskEnvironment:
        """The reusable environment of these replicas."""
        return inference_environment(
            name, image=image, gpu=self.gpu, replicas=self.replicas, concurrency=self.concurrency
        )


def driver_environment(name: str, *depends_on: flyte.TaskEnvironment) -> flyte.TaskEnvironment:
    """A driver's environment: the driver image, no GPU, deployed together with the replicas it calls."""
    return flyte.TaskEnvironment(
        name=name,
        image=driver_image,
        resources=flyte.Resources(cpu=2, memory="4Gi"),
        depends_on=list(depends_on),
    )
