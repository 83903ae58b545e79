"""Mirror of `vllm.entrypoints.llm` (vLLM 0.33.0): the offline `LLM` class."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from vllm._model import FakeTokenizer, decode_steps, parse_prompt, request_output, start_engine, validate_prompt
from vllm._testing import RECORDER, GenerateCall
from vllm.config import VllmConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.outputs import RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.exceptions import EngineDeadError


class _EngineCoreClient:
    def __init__(self) -> None:
        self.dead = False

    def shutdown(self, timeout: float | None = None) -> None:
        if not self.dead:
            RECORDER.shutdowns += 1
        self.dead = True


class LLMEngine:
    """Mirror of `vllm.v1.engine.llm_engine.LLMEngine`: config, tokenizer and engine-core client."""

    def __init__(self, vllm_config: VllmConfig, tokenizer: FakeTokenizer) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.engine_core = _EngineCoreClient()
        self._tokenizer = tokenizer

    def get_tokenizer(self) -> FakeTokenizer:
        return self._tokenizer


class LLM:
    """Offline inference: `generate` runs a whole list of prompts and returns when all finish."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        RECORDER.llm_inits.append({"model": model, **kwargs})
        # LLM turns stats logging off unless asked, unlike AsyncEngineArgs.
        kwargs.setdefault("disable_log_stats", True)
        config, tokenizer = start_engine(EngineArgs(model=model, **kwargs))
        self.llm_engine = LLMEngine(config, tokenizer)
        self.model_config = config.model_config
        self.request_counter = itertools.count()

    def get_tokenizer(self) -> FakeTokenizer:
        return self.llm_engine.get_tokenizer()

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: Any = True,
        lora_request: Any = None,
        priority: int | Sequence[int] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        RECORDER.generate_calls.append(GenerateCall(prompts, sampling_params, use_tqdm))
        if self.llm_engine.engine_core.dead:
            raise EngineDeadError("the engine core has shut down")
        prompt_list = [prompts] if isinstance(prompts, (str, Mapping)) else list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompt_list)
        else:
            params_list = list(sampling_params)
        if len(params_list) != len(prompt_list):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")

        tokenizer = self.get_tokenizer()
        max_model_len = self.model_config.max_model_len
        parsed = [parse_prompt(prompt, tokenizer) for prompt in prompt_list]
        # Like vLLM, one invalid prompt fails the whole call.
        for _, ids in parsed:
            validate_prompt(ids, max_model_len)
        outputs = []
        for (text, ids), params in zip(parsed, params_list, strict=True):
            *_, final = decode_steps(ids, params, tokenizer, max_model_len)
            outputs.append(request_output(str(next(self.request_counter)), text, ids, final))
        return outputs
