"""A small, deterministic stand-in for vLLM, for tests only (never installed).

It mirrors the public API of **vLLM 0.33.0** (the module paths, class names and keyword names
that `flyteplugins_batcher.engines._vllm` uses):

- `vllm.LLM(model, **engine_kwargs)` with `generate(prompts, sampling_params=None, *, use_tqdm=True, ...)`,
  `get_tokenizer()`, and `llm.llm_engine.vllm_config` / `llm.llm_engine.engine_core.shutdown()`;
- `vllm.SamplingParams` (`vllm.sampling_params`) and `RequestOutputKind`;
- `vllm.outputs.RequestOutput` / `CompletionOutput`;
- `vllm.engine.arg_utils.EngineArgs` / `AsyncEngineArgs`;
- `vllm.v1.engine.async_llm.AsyncLLM` with `from_engine_args(...)`, the async-generator
  `generate(prompt, sampling_params, request_id, ...)`, the synchronous `get_tokenizer()` and `shutdown()`;
- `vllm.config.VllmConfig` with `model_config.max_model_len`, `scheduler_config.max_num_seqs`,
  `cache_config.num_gpu_blocks` / `block_size`.

The "model" is a character-level echo: it answers a prompt with the prompt's text reversed, then EOS,
honouring `max_tokens`, `stop` and `max_model_len` like vLLM does. `vllm._testing.RECORDER` records
every call and lets a test inject per-request failures and per-step latency.
"""

from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.entrypoints.llm import LLM
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams

__version__ = "0.33.0"

__all__ = [
    "LLM",
    "AsyncEngineArgs",
    "AsyncLLMEngine",
    "CompletionOutput",
    "EngineArgs",
    "RequestOutput",
    "SamplingParams",
    "__version__",
]
