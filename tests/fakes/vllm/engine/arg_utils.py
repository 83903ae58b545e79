"""Mirror of `vllm.engine.arg_utils` (vLLM 0.33.0), reduced to the engine keywords tests use.

Like the real dataclasses, an unknown keyword raises `TypeError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

FAKE_MODEL_MAX_LEN = 256
"""The fake model's context length, when `max_model_len` is not given."""


@dataclass
class EngineArgs:
    model: str = "fake/echo"
    tokenizer: str | None = None
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    quantization: str | None = None
    revision: str | None = None
    seed: int = 0
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.92
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool = False
    disable_log_stats: bool = False

    def create_engine_config(self, usage_context: Any = None) -> VllmConfig:
        return VllmConfig(
            model_config=ModelConfig(model=self.model, max_model_len=self.max_model_len or FAKE_MODEL_MAX_LEN),
            scheduler_config=SchedulerConfig(
                max_num_seqs=self.max_num_seqs or 256,
                max_num_batched_tokens=self.max_num_batched_tokens or 8192,
            ),
            cache_config=CacheConfig(
                block_size=self.block_size or 16, gpu_memory_utilization=self.gpu_memory_utilization
            ),
        )


@dataclass
class AsyncEngineArgs(EngineArgs):
    enable_log_requests: bool = False
