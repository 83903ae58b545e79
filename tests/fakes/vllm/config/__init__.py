"""Mirror of `vllm.config` (vLLM 0.33.0), reduced to the limits an engine reads after start-up."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    model: str
    max_model_len: int
    runner_type: str = "generate"


@dataclass
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int


@dataclass
class CacheConfig:
    block_size: int
    gpu_memory_utilization: float
    # vLLM fills this in once the engine core has profiled memory.
    num_gpu_blocks: int | None = None


@dataclass
class VllmConfig:
    model_config: ModelConfig
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
