"""vLLM engine: whole batches through the offline `LLM`, or one request per record into `AsyncLLM`.

Two ways to drive vLLM from the batcher:

- `mode="batch"`: `generate` is a plain `def` that hands a whole batch to `LLM.generate`. The
  batcher runs it in a worker thread, so producers keep loading data while the GPU works, but the
  GPU idles through each batch's tail (the last few long completions) and between batches.
- `mode="stream"`: `generate` is an `async def` that submits every record of its (tiny) batch as
  its own request to vLLM's async engine. With `max_batch_size=1`, many concurrent batches and a
  bound on tokens in flight, each record reaches vLLM as soon as it arrives and vLLM's continuous
  batching keeps the GPU full (Ray Data LLM reports about 2x over the offline engine from this).

Both pass vLLM token ids (`TokensPrompt`) that this engine rendered and counted itself, so token
budgets, length checks and stats agree exactly with what vLLM runs. Written against vLLM 0.33.0;
uses only API that exists since vLLM 0.10.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import gc
import inspect
import itertools
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from flyteplugins_batcher._errors import short_repr
from flyteplugins_batcher.engines._base import (
    Completion,
    Engine,
    FinishReason,
    GenerationConfig,
    InvalidPromptError,
    PromptRecord,
)

VLLMMode = Literal["batch", "stream"]

_INSTALL_HINT = "pip install 'flyteplugins-batcher[vllm]'"

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "repetition": "stop"}
"""vLLM finish reasons that mean a usable completion. "repetition" (vLLM's loop detector ended the
sequence) is an engine-chosen stop, not the length limit. "abort" and "error" fail the record."""

_ASSUMED_MAX_NUM_SEQS = 256
"""vLLM's long-standing default for `max_num_seqs`, used for batcher settings before `load()`."""

_ASSUMED_TOKENS_PER_SEQ = 1024
"""KV-cache tokens per sequence assumed for batcher settings when vLLM has not reported its cache size."""

_STREAM_OVERCOMMIT = 2
"""Stream mode lets estimated tokens in flight reach this multiple of the KV cache: estimates count
every record's full `max_new_tokens` although most stop earlier, and vLLM needs a waiting queue to
refill slots the moment sequences finish."""

_TOKENIZE_CACHE_SIZE = 8192
"""Rendered prompts whose token ids are kept: the batcher's estimate and `generate` tokenize each
record once each, and in stream mode both run on the event loop."""


@dataclass(frozen=True)
class _Limits:
    max_model_len: int | None
    max_num_seqs: int
    kv_cache_tokens: int

    @classmethod
    def assumed(cls, llm_kwargs: Mapping[str, Any]) -> _Limits:
        max_num_seqs = llm_kwargs.get("max_num_seqs") or _ASSUMED_MAX_NUM_SEQS
        return cls(llm_kwargs.get("max_model_len"), max_num_seqs, max_num_seqs * _ASSUMED_TOKENS_PER_SEQ)

    @classmethod
    def read(cls, vllm_config: Any) -> _Limits:
        """The limits vLLM settled on at start-up (after profiling memory for the KV cache)."""
        max_num_seqs = vllm_config.scheduler_config.max_num_seqs or _ASSUMED_MAX_NUM_SEQS
        cache = vllm_config.cache_config
        blocks, block_size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
        kv_cache_tokens = blocks * block_size if blocks and block_size else max_num_seqs * _ASSUMED_TOKENS_PER_SEQ
        return cls(vllm_config.model_config.max_model_len, max_num_seqs, kv_cache_tokens)


class VLLMEngine(Engine):
    """Generates with vLLM, in whole batches (`mode="batch"`) or streamed per record (`mode="stream"`).

    vLLM is imported on `load()`, so this module imports without it.

    Args:
        model: A Hugging Face model id or local path, as `vllm.LLM` takes it.
        mode: `"batch"`: `generate` blocks on `LLM.generate` for the whole batch (the batcher runs it
            in a worker thread). `"stream"`: `generate` is a coroutine that sends each record to
            `AsyncLLM` as its own request and returns when all have finished; pair it with the
            defaults of `batcher()` (batches of one, many in flight, tokens in flight bounded).
        generation: Generation settings, mapped to `SamplingParams`.
        system_prompt: Prepended as a system message when the chat template is used.
        chat_template: Render records through the tokenizer's chat template; `None` means "when
            the tokenizer has one".
        **llm_kwargs: Passed to `vllm.LLM` (batch) or `AsyncEngineArgs` (stream), for example
            `gpu_memory_utilization`, `max_model_len`, `dtype`, `tensor_parallel_size`.

    Note:
        In stream mode vLLM binds its output handler to the event loop that first uses the engine;
        `generate` raises if called from another loop. `close()` and `load()` again to move loops.

    Example:
        ```python
        engine = VLLMEngine("HuggingFaceTB/SmolLM2-360M-Instruct", mode="stream", max_model_len=4096)
        engine.load()
        async with engine.batcher() as batcher:
            answers = await batcher.run(["What is 2 + 2?", "Name a prime above 10."])
        print(engine.stats.completion_tokens_per_s)
        ```
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        mode: VLLMMode = "batch",
        generation: GenerationConfig | None = None,
        system_prompt: str | None = None,
        chat_template: bool | None = None,
        **llm_kwargs: Any,
    ) -> None:
        if mode not in ("batch", "stream"):
            raise ValueError(f"mode must be 'batch' or 'stream', got {mode!r}")
        super().__init__(generation=generation, system_prompt=system_prompt, chat_template=chat_template)
        self.model = model
        self.mode: VLLMMode = mode
        self.llm_kwargs = dict(llm_kwargs)
        self._llm: Any = None
        self._async_llm: Any = None
        self._tokenizer: Any = None
        self._encode: Any = None
        self._limits: _Limits | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._request_ids = itertools.count()
        # vLLM's offline LLM is not thread-safe; a second concurrent batch waits its turn.
        self._llm_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._requests_running = 0
        self._busy_since = 0.0
        if mode == "stream":
            # The batcher awaits a coroutine function on the loop and runs a plain one in a thread,
            # so stream mode must expose the coroutine itself as `generate`.
            self.generate = self._generate_stream  # type: ignore[method-assign, assignment]

    # -- lifecycle -----------------------------------------------------------------------------

    def _load(self) -> None:
        vllm = _import_vllm()
        if self.mode == "batch":
            self._llm = vllm.LLM(self.model, **self.llm_kwargs)
            tokenizer, vllm_config = self._llm.get_tokenizer(), self._llm.llm_engine.vllm_config
        else:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            # Match vllm.LLM, which keeps the periodic stats log off unless asked.
            args = AsyncEngineArgs(model=self.model, **{"disable_log_stats": True, **self.llm_kwargs})
            self._async_llm = AsyncLLM.from_engine_args(args)
            tokenizer, vllm_config = _resolve(self._async_llm.get_tokenizer()), self._async_llm.vllm_config
        self._tokenizer = tokenizer
        self._limits = _Limits.read(vllm_config)
        # vLLM adds BOS to plain-text prompts; a chat template writes its own, so none is added then.
        add_special_tokens = not self.uses_chat_template()

        @functools.lru_cache(maxsize=_TOKENIZE_CACHE_SIZE)
        def encode(text: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(text, add_special_tokens=add_special_tokens))

        self._encode = encode

    def _close(self) -> None:
        if self._async_llm is not None:
            self._async_llm.shutdown()
        if self._llm is not None:
            _shutdown_offline(self._llm)
        self._llm = self._async_llm = self._tokenizer = self._encode = self._limits = self._loop = None
        _release_cuda_memory()

    # -- prompts and tokens --------------------------------------------------------------------

    @property
    def context_length(self) -> int:
        limits = self._require(self._limits)
        if limits.max_model_len is None:  # vLLM always reports one once loaded; this is for type checkers
            raise RuntimeError(f"{self.name}: vLLM reported no max_model_len")
        return limits.max_model_len

    def tokenize(self, text: str) -> list[int]:
        """Token ids as vLLM will see them: BOS added for plain text; chat templates carry their own."""
        return list(self._require(self._encode)(text))

    def _has_chat_template(self) -> bool:
        return getattr(self._require(self._tokenizer), "chat_template", None) is not None

    def _apply_chat_template(self, messages: list[Mapping[str, str]]) -> str:
        return self._require(self._tokenizer).apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )

    # -- generation ----------------------------------------------------------------------------

    def generate(self, records: list[PromptRecord]) -> list[Completion | Exception]:
        """Run a batch through `LLM.generate` (batch mode); one entry per record, in input order.

        Invalid records get an `InvalidPromptError` in their slot and are not sent to vLLM.
        """
        llm = self._require(self._llm)
        prompts = self._prepare(records)
        valid = [ids for ids in prompts if isinstance(ids, list)]
        outcomes: list[Completion | Exception] = []
        if valid:
            params = self._sampling_params()
            with self._llm_lock, self._busy():
                outputs = llm.generate([{"prompt_token_ids": ids} for ids in valid], params, use_tqdm=False)
            outcomes = [_completion(output, len(ids)) for ids, output in zip(valid, outputs, strict=True)]
        results = _merge(prompts, outcomes)
        self._record(results, sent=bool(valid))
        return results

    async def _generate_stream(self, records: list[PromptRecord]) -> list[Completion | Exception]:
        """Send each record to `AsyncLLM` as its own request, concurrently; return when all finish.

        A request that fails (invalid, or an error inside vLLM) fails only its own record.
        """
        engine = self._require(self._async_llm)
        self._check_loop()
        prompts = self._prepare(records)
        params = self._sampling_params(final_only=True)
        valid = [ids for ids in prompts if isinstance(ids, list)]
        outcomes = await asyncio.gather(
            *(self._stream_one(engine, ids, params) for ids in valid), return_exceptions=True
        )
        for outcome in outcomes:
            if not isinstance(outcome, (Completion, Exception)):
                raise outcome  # a BaseException such as KeyboardInterrupt is not one record's failure
        results = _merge(prompts, outcomes)
        self._record(results, sent=bool(valid))
        return results

    async def _stream_one(self, engine: Any, prompt_token_ids: list[int], params: Any) -> Completion | Exception:
        request_id = f"flyteplugins-batcher-{next(self._request_ids)}"
        final = None
        with self._busy():
            async for output in engine.generate({"prompt_token_ids": prompt_token_ids}, params, request_id):
                final = output
        if final is None or not final.finished:
            return RuntimeError(f"{self.name}: request {request_id} ended without a final output")
        return _completion(final, len(prompt_token_ids))

    def _prepare(self, records: list[PromptRecord]) -> list[list[int] | Exception]:
        """Each record's prompt token ids, or the `InvalidPromptError` that keeps it from vLLM."""
        return [self._prepare_one(index, record) for index, record in enumerate(records)]

    def _prepare_one(self, index: int, record: PromptRecord) -> list[int] | Exception:
        max_new_tokens = self.generation.max_new_tokens
        try:
            ids = self.tokenize(self.render(record))
        except InvalidPromptError as exc:
            return self._invalid(index, record, str(exc))
        except Exception as exc:  # a chat template can reject a conversation (e.g. roles out of order)
            error = self._invalid(index, record, f"cannot render the prompt: {exc}")
            error.__cause__ = exc
            return error
        if len(ids) + max_new_tokens > self.context_length:
            return self._invalid(
                index,
                record,
                f"{len(ids)} prompt tokens + max_new_tokens={max_new_tokens} exceed the context length of "
                f"{self.context_length}",
            )
        return ids

    def _invalid(self, index: int, record: PromptRecord, reason: str) -> InvalidPromptError:
        return InvalidPromptError(f"{self.name}: record {index} ({short_repr(record)}): {reason}")

    def _sampling_params(self, *, final_only: bool = False) -> Any:
        """`SamplingParams` for the current `GenerationConfig`."""
        from vllm import SamplingParams

        config = self.generation
        options: dict[str, Any] = {
            "n": 1,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "seed": config.seed,
            "max_tokens": config.max_new_tokens,
            "stop": list(config.stop),
        }
        if final_only:
            from vllm.sampling_params import RequestOutputKind

            # Only the finished output is used; skipping per-token outputs saves a loop wake-up per token.
            options["output_kind"] = RequestOutputKind.FINAL_ONLY
        return SamplingParams(**options)

    def _check_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            # vLLM's output handler lives on the first loop; on another one requests would never finish.
            raise RuntimeError(
                f"{self.name}: stream mode is bound to the event loop that first called generate; "
                "call close() and load() to use the engine from another event loop"
            )

    # -- accounting ----------------------------------------------------------------------------

    @contextmanager
    def _busy(self) -> Iterator[None]:
        # Stream mode runs many requests at once: summing their durations would overstate model
        # time, so generate_time_s counts wall time with at least one request running.
        with self._stats_lock:
            if self._requests_running == 0:
                self._busy_since = time.perf_counter()
            self._requests_running += 1
        try:
            yield
        finally:
            with self._stats_lock:
                self._requests_running -= 1
                if self._requests_running == 0:
                    self.stats.generate_time_s += time.perf_counter() - self._busy_since

    def _record(self, results: list[Completion | Exception], *, sent: bool) -> None:
        completions = [result for result in results if isinstance(result, Completion)]
        prompt_tokens = sum(completion.prompt_tokens for completion in completions)
        completion_tokens = sum(completion.completion_tokens for completion in completions)
        with self._stats_lock:
            stats = self.stats
            stats.batches += int(sent)
            stats.records += len(completions)
            stats.failed_records += len(results) - len(completions)
            stats.prompt_tokens += prompt_tokens
            stats.completion_tokens += completion_tokens
            # vLLM packs sequences without padding: every position computed is a real token.
            stats.real_tokens += prompt_tokens + completion_tokens
            stats.padded_tokens += prompt_tokens + completion_tokens

    # -- batching ------------------------------------------------------------------------------

    def batcher_defaults(self) -> dict[str, Any]:
        """Batcher settings from the limits vLLM settled on (assumed ones before `load()`).

        Stream mode: batches of one record dispatched at once, up to `max(1024, 4 * max_num_seqs)`
        requests in flight, estimated tokens in flight bounded at twice the KV cache. Batch mode:
        up to `max_num_seqs` records and a KV cache's worth of estimated tokens per batch, so that
        a batch never has to wait inside vLLM for cache space.
        """
        limits = self._limits or _Limits.assumed(self.llm_kwargs)
        if self.mode == "stream":
            return {
                "max_batch_size": 1,
                "batch_timeout_s": 0.0,
                "max_concurrent_batches": max(1024, 4 * limits.max_num_seqs),
                "max_inflight_tokens": _STREAM_OVERCOMMIT * limits.kv_cache_tokens,
            }
        return {"max_batch_size": limits.max_num_seqs, "target_batch_tokens": limits.kv_cache_tokens}

    def _require(self, handle: Any) -> Any:
        if handle is None:
            raise RuntimeError(f"{self.name}: the engine is not loaded (mode={self.mode!r}); call load() first")
        return handle


def _merge(prompts: list[list[int] | Exception], outcomes: list[Any]) -> list[Completion | Exception]:
    """Results in input order: each invalid record's error, and the outcomes of the others in turn."""
    remaining = iter(outcomes)
    return [next(remaining) if isinstance(ids, list) else ids for ids in prompts]


def _completion(output: Any, prompt_tokens: int) -> Completion | Exception:
    """A `Completion` from vLLM's final `RequestOutput`, or the error for an aborted request."""
    choice = output.outputs[0]
    finish_reason = _FINISH_REASONS.get(choice.finish_reason or "")
    if finish_reason is None:
        return RuntimeError(f"vllm: request {output.request_id} ended with finish_reason={choice.finish_reason!r}")
    return Completion(
        text=choice.text,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(choice.token_ids),
        finish_reason=finish_reason,
    )


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"VLLMEngine needs vLLM, which is not installed: {_INSTALL_HINT}") from exc
    return vllm


def _resolve(value: Any) -> Any:
    """`value`, or what it resolves to when it is awaitable (`AsyncLLM.get_tokenizer` was async before 0.11)."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    # load() is synchronous and may run on a thread whose event loop is busy, so use a fresh one.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def _shutdown_offline(llm: Any) -> None:
    """Stop the engine-core process behind a `vllm.LLM` (best effort: its API is internal)."""
    engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    shutdown = getattr(engine_core, "shutdown", None)
    if callable(shutdown):
        shutdown()


def _release_cuda_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")  # vLLM imported it if it ran; never import torch just to clean up
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
