"""Mirror of `vllm.engine.async_llm_engine` (vLLM 0.33.0): `AsyncLLMEngine` is an alias of the V1 `AsyncLLM`."""

from vllm.v1.engine.async_llm import AsyncLLM

AsyncLLMEngine = AsyncLLM
