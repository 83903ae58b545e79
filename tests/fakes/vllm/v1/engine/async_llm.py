"""Mirror of `vllm.v1.engine.async_llm` (vLLM 0.33.0): `AsyncLLM`, the engine behind online serving.

Requests run concurrently; each `RECORDER.step_s` every running request advances one token,
which is how continuous batching behaves from the caller's side.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from vllm._model import FakeTokenizer, decode_steps, parse_prompt, request_output, start_engine, validate_prompt
from vllm._testing import RECORDER
from vllm.config import VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import GenerationError
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.exceptions import EngineDeadError


class AsyncLLM:
    def __init__(self, vllm_config: VllmConfig, tokenizer: FakeTokenizer, *, log_stats: bool) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.scheduler_config = vllm_config.scheduler_config
        self.log_stats = log_stats
        self._tokenizer = tokenizer
        self._dead = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_engine_args(
        cls,
        engine_args: AsyncEngineArgs,
        start_engine_loop: bool = True,
        usage_context: Any = None,
        stat_loggers: Any = None,
    ) -> AsyncLLM:
        RECORDER.engine_args.append(engine_args)
        config, tokenizer = start_engine(engine_args)
        return cls(config, tokenizer, log_stats=not engine_args.disable_log_stats)

    @property
    def tokenizer(self) -> FakeTokenizer:
        return self._tokenizer

    def get_tokenizer(self) -> FakeTokenizer:
        return self._tokenizer

    @property
    def errored(self) -> bool:
        return self._dead

    async def generate(
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt_text: str | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        if self._dead:
            raise EngineDeadError("the engine core has shut down")
        self._check_loop()
        if sampling_params.output_kind is RequestOutputKind.DELTA:
            raise NotImplementedError("fake vllm: RequestOutputKind.DELTA is not modelled")
        text, ids = parse_prompt(prompt, self._tokenizer)
        validate_prompt(ids, self.model_config.max_model_len)
        trace = RECORDER.start(request_id, ids, sampling_params)
        try:
            content = self._tokenizer.decode(ids, skip_special_tokens=True)
            for step in decode_steps(ids, sampling_params, self._tokenizer, self.model_config.max_model_len):
                await asyncio.sleep(RECORDER.step_s)
                if RECORDER.fail_marker is not None and RECORDER.fail_marker in content:
                    raise GenerationError(f"request {request_id} failed in the engine")
                if step.finish_reason is not None or sampling_params.output_kind is RequestOutputKind.CUMULATIVE:
                    yield request_output(request_id, text, ids, step)
        finally:
            RECORDER.finish(trace)

    def shutdown(self, timeout: float | None = None) -> None:
        if not self._dead:
            RECORDER.shutdowns += 1
        self._dead = True

    def _check_loop(self) -> None:
        # The real AsyncLLM starts its output handler on the first loop that uses it; on any other
        # loop requests would wait forever. The fake fails loudly instead.
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("fake vllm: AsyncLLM used from a second event loop (the real one would hang)")
