"""Flyte environments of the jobs: pools of reusable replicas sized from environment variables, and drivers.

Replicas, concurrent calls per replica and the GPU type are environment-level settings, fixed when
a workflow module is imported: set `<PREFIX>_REPLICAS`, `<PREFIX>_CONCURRENCY` and `<PREFIX>_GPU`
(for example `A100:1`, or `none` for CPU replicas) before `flyte run` / `flyte deploy`. The LLM
replicas read `BATCH_LLM_*`, the embedding replicas `EMBED_*`.

The LLM replicas' default concurrency (and the jobs' default chunk size, `LLM_SIZING`) comes from
`size_in_flight` for the engine's `max_num_seqs`: `BATCH_LLM_MAX_NUM_SEQS`, else vLLM's default for
the GPU type (1024 on H100-class GPUs, 256 elsewhere).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import flyte

from flyteplugins_batcher import InFlight, inference_environment, size_in_flight
from flyteplugins_batcher.images import DRIVER_SPEC, EMBED_SPEC, GPU_SPEC


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
        gpu_env = pool.environment("batch_llm_gpu", image=GPU_SPEC.resolve())
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


DRIVER_ALLOCATOR_ENV = {"MALLOC_ARENA_MAX": "2", "ARROW_DEFAULT_MEMORY_POOL": "system"}
"""A driver's allocators, set in its container: it streams a table through a few worker threads and holds little,
and with glibc's default of one malloc arena per busy thread (and Arrow's own pool beside them) the memory freed
between windows stays held, so its peak grew with the table's length (`benchmarks/bench_table_memory.py`)."""


def driver_environment(name: str, *depends_on: flyte.TaskEnvironment) -> flyte.TaskEnvironment:
    """A driver's environment: the driver image, no GPU, its allocators held to what streaming needs, deployed
    together with the replicas it calls."""
    return flyte.TaskEnvironment(
        name=name,
        image=DRIVER_SPEC.resolve(),
        resources=flyte.Resources(cpu=2, memory="4Gi"),
        env_vars=dict(DRIVER_ALLOCATOR_ENV),
        depends_on=list(depends_on),
    )


DEFAULT_GPU = "L4:1"


_LARGE_GPUS = ("H100", "H200", "H20", "GH200", "B200", "B300", "GB200", "MI300")
"""GPUs of 70 GiB or more (other than the A100), to which vLLM (0.9+) gives 1024 sequences by default."""


def vllm_default_max_num_seqs(gpu: str | None) -> int:
    """vLLM's default `max_num_seqs` on a GPU requested as `"H100:1"`: 1024 on H100-class GPUs, else 256."""
    kind = (gpu or "").split(":")[0].upper()
    return 1024 if kind.startswith(_LARGE_GPUS) else 256


def sizing_from_environment() -> InFlight:
    """In-flight work sized for `BATCH_LLM_MAX_NUM_SEQS`, else for vLLM's default on `BATCH_LLM_GPU`."""
    capacity = os.environ.get("BATCH_LLM_MAX_NUM_SEQS") or vllm_default_max_num_seqs(
        os.environ.get("BATCH_LLM_GPU", DEFAULT_GPU)
    )
    return size_in_flight(int(capacity))


LLM_SIZING = sizing_from_environment()


LLM_POOL = ReplicaPool.from_environment("BATCH_LLM", replicas=2, concurrency=LLM_SIZING.concurrency, gpu=DEFAULT_GPU)


gpu_env = LLM_POOL.environment("batch_llm_gpu", image=GPU_SPEC.resolve())


EMBED_POOL = ReplicaPool.from_environment("EMBED", replicas=2, concurrency=8)


embed_env = EMBED_POOL.environment("embed_gpu", image=EMBED_SPEC.resolve())
