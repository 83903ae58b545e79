"""VLLMStreamEngine: each record is its own request to vLLM's `AsyncLLM`, whose continuous batching fills the device.

`AsyncLLM` runs on a private event loop (`EngineLoop`), so the engine works from any caller loop,
survives the callers' loops coming and going, and keeps vLLM's output processing off the loop
where producers prepare data.

A record with a text listener (`Request.on_delta`) is asked of vLLM with `RequestOutputKind.DELTA`
and its listener hears each step's new text (and its tokens' logprobs), on the engine loop; every other record keeps
`FINAL_ONLY` (no wake-up per token). A record whose caller cancels it (`Request.cancellation`) is
aborted in vLLM (`AsyncLLM.abort`), which frees its sequence slot at the next step; it is answered
with `RequestCancelledError` and the tokens it got.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from flyteplugins_batcher.engines._base import LoadedModel, Outcome, StreamingEngine
from flyteplugins_batcher.engines._completion import Completion
from flyteplugins_batcher.engines._engine_errors import EngineDeadError, RequestCancelledError
from flyteplugins_batcher.engines._prompts import PreparedPrompt
from flyteplugins_batcher.engines.vllm._deltas import StreamedSamples, abort_when_cancelled
from flyteplugins_batcher.engines.vllm._engine import (
    VLLMMode,
    VLLMSupport,
    completion,
    config_errors,
    import_vllm,
    quiet_engine_death_tracebacks,
    release_cuda_memory,
    sampling_params,
)
from flyteplugins_batcher.engines.vllm._engine_loop import EngineLoop


class VLLMStreamEngine(VLLMSupport, StreamingEngine):
    """Generates with vLLM's `AsyncLLM`, one request per record (`mode="stream"`).

    Pair it with `batcher()`'s defaults: batches of one record, dispatched at once, many in flight,
    tokens in flight bounded by the KV cache. vLLM then schedules every record the moment it
    arrives, and refills a sequence slot the moment one finishes.

    A `Request` with `on_delta` hears each step's new text as vLLM makes it; one whose
    `cancellation` is cancelled while it runs is aborted in vLLM and answered with
    `RequestCancelledError` (the tokens it got counted).

    Args:
        model: A Hugging Face model id or local path.
        **kwargs: See `VLLMSupport`.

    Example:
        ```python
        engine = VLLMStreamEngine(str(bundled_smollm2_path()))
        engine.load()
        async with engine.batcher() as batcher:
            answers = await batcher.run(prompts)
        ```
    """

    mode: VLLMMode = "stream"

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._engine_loop: EngineLoop | None = None
        self._async_llm: Any = None
        self._request_ids = itertools.count()

    def _load(self) -> LoadedModel:
        vllm = import_vllm()
        from flyteplugins_batcher.engines.vllm._steps import StepRecorder

        args = {"disable_log_stats": True, **self._resolved_engine_args(vllm)}  # as vllm.LLM does
        steps = StepRecorder.factory(self._counters.count_step)  # turns vLLM's statistics on, without its log lines
        loop = EngineLoop(f"{self.name}-engine-loop")
        try:
            with config_errors(self.model):
                self._async_llm = loop.call(_start_async_llm(self.source, args, [steps]))
        except BaseException:
            loop.close()
            raise
        self._engine_loop = loop
        loaded = self._started(self._async_llm.get_tokenizer(), self._async_llm.vllm_config)
        self._watch(self._async_llm)
        quiet_engine_death_tracebacks()
        return loaded

    def _close(self) -> None:
        self._closing.set()
        loop, llm = self._engine_loop, self._async_llm
        self._engine_loop = self._async_llm = None
        self._limits = self._vllm_config = None
        if loop is not None:
            if llm is not None:
                try:
                    loop.call(_shutdown(llm, self._exit_grace_s), timeout=60)
                except Exception as error:  # a dead engine may not shut down cleanly; its process is gone anyway
                    self._dead.set()
                    del error
            loop.close()
        release_cuda_memory()

    async def _run(self, prompts: list[PreparedPrompt]) -> list[Outcome]:
        """Each prompt as its own request, all at once; a request that fails fails only its record."""
        self._check_alive()
        loop, llm = self._engine_loop, self._async_llm
        assert loop is not None
        outcomes = await asyncio.gather(
            *(loop.wrap(self._request(llm, prompt)) for prompt in prompts), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, EngineDeadError) or self._dead.is_set():
                raise self._dead_error() from (outcome if isinstance(outcome, BaseException) else None)
            if not isinstance(outcome, (Completion, Exception)):
                raise outcome  # a BaseException such as KeyboardInterrupt is not one record's failure
        return list(outcomes)  # type: ignore[arg-type]

    async def _request(self, llm: Any, prompt: PreparedPrompt) -> Outcome:
        """One record's request, on the engine loop: its text streamed if it has a listener, aborted if cancelled."""
        from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

        request_id = f"flyteplugins-batcher-{next(self._request_ids)}"
        if prompt.cancelled:  # its caller left while it was on its way here
            return RequestCancelledError(f"{self.name}: request {request_id} was cancelled")
        streamed = prompt.on_delta is not None
        params = sampling_params(prompt.generation, final_only=not streamed, deltas=streamed)
        samples = StreamedSamples(prompt, request_id, self._tokenizer)
        assert self._engine_loop is not None
        ended = abort_when_cancelled(self._engine_loop, llm, prompt, request_id)
        inputs = {"prompt_token_ids": prompt.token_ids}
        try:
            async for output in llm.generate(inputs, params, request_id, lora_request=self._lora_request(prompt)):
                samples.add(output)
        except VLLMEngineDeadError as error:
            raise self._dead_error() from error
        finally:
            ended.set()
        if samples.aborted and prompt.cancelled:
            message = f"{self.name}: request {request_id} was cancelled"
            return RequestCancelledError(message, completion_tokens=samples.tokens)
        if not samples.finished:
            return RuntimeError(f"{self.name}: request {request_id} ended without a final output")
        return completion(samples.final(), len(prompt.token_ids), prompt.generation, self._tokenizer)


async def _start_async_llm(model: str, engine_args: dict[str, Any], stat_loggers: list[Any]) -> Any:
    """Build `AsyncLLM` on the engine loop, so that its output handling is bound to that loop.

    With `vllm.LLM`'s usage context: vLLM sizes `max_num_seqs` and `max_num_batched_tokens` by it
    (`EngineArgs.get_batch_defaults`), and `AsyncLLM`'s own default context gets the generic
    128 sequences and 2,048 tokens per step on any GPU, where `vllm.LLM` gets 1,024 and 16,384 on an
    H100. This engine serves an offline batch job, as `vllm.LLM` does.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=model, **engine_args), usage_context=UsageContext.LLM_CLASS, stat_loggers=stat_loggers
    )


async def _shutdown(llm: Any, grace_s: float) -> None:
    llm.shutdown(timeout=grace_s)
