"""vLLM engines: whole batches through the offline `LLM` (`VLLMEngine`), or one request per record into `AsyncLLM`.

- `VLLMEngine` (`mode="batch"`): `generate` is a plain `def` that hands a whole batch to
  `LLM.generate`. The batcher runs it in a worker thread, so producers keep loading data while the
  device works, but the device idles through each batch's tail (the last long completions) and
  waits for the next batch. `LLM.generate` cannot stop one request of a running batch, nor hand
  out text before the batch ends: a record cancelled while it runs is generated to its end (one
  cancelled before never runs), and a streamed answer arrives whole.
- `VLLMStreamEngine` (`mode="stream"`): `generate` is a coroutine that submits every record of its
  (tiny) batch as its own request to vLLM's `AsyncLLM`. With batches of one, many in flight and a
  bound on tokens in flight, each record reaches vLLM as soon as it arrives and vLLM's continuous
  batching keeps the device full.

Both pass vLLM token ids that the engine rendered and counted itself, so token budgets, length
checks and stats agree exactly with what vLLM runs, and both take per-record settings (one
`SamplingParams` per prompt: logprobs, penalties, logit bias, structured output) and LoRA adapters
(`lora_modules`: a record's `adapter` becomes its `LoRARequest`, beside base-model records in the
same steps). Both notice when vLLM's engine-core process dies: every pending and
later record fails with `EngineDeadError` at once, instead of waiting forever.
"""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import multiprocessing.connection
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from flyteplugins_batcher import BatcherSettings
from flyteplugins_batcher.engines import _install
from flyteplugins_batcher.engines._base import (
    BatchEngine,
    Engine,
    LoadedModel,
    Outcome,
    stream_batcher_settings,
    take_engine_options,
    with_engine_options,
)
from flyteplugins_batcher.engines._completion import LOGPROB_FLOOR, Completion, FinishReason, Sample, TokenLogprob
from flyteplugins_batcher.engines._config import GenerationConfig
from flyteplugins_batcher.engines._engine_errors import EngineConfigError, EngineDeadError, InvalidResponseFormatError
from flyteplugins_batcher.engines._lora import checked_adapters, lora_rank
from flyteplugins_batcher.engines._model_reference import model_display_name
from flyteplugins_batcher.engines._object_store import StoredModel, is_remote
from flyteplugins_batcher.engines._prompts import PreparedPrompt
from flyteplugins_batcher.engines._reasoning import ReasoningParser, vllm_reasoning_parser
from flyteplugins_batcher.engines._response_format import ResponseFormat
from flyteplugins_batcher.engines.vllm._args import (
    accepted_arguments,
    check_engine_args,
    running_on_cpu,
    with_compact_json,
    with_device_defaults,
)

logger = logging.getLogger("flyteplugins_batcher")

VLLMMode = Literal["batch", "stream"]

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "repetition": "stop"}
"""vLLM finish reasons that mean a usable completion. "repetition" (vLLM's loop detector ended the
sequence) is an engine-chosen stop, not the length limit. "abort" and "error" fail the record."""

ENGINE_EXIT_GRACE_S = 1.0
"""Seconds vLLM's engine-core process gets to exit once `close()` asked it to; then vLLM kills it.

vLLM's own default is 5 s, and its process does not exit within it: the worker frees the model and
KV cache at once, then it and the engine process spend seconds in Python's final garbage
collection of their large heaps, so every `close()` waited the full 5 s and ended in a kill anyway.
What the process still holds when it is killed (memory, device memory, its workers) goes with it;
on CPU, one shared-memory segment of vLLM's worker queue (about 40 KiB in use) stays until this
process exits, when Python's resource tracker removes it."""

DEATH_REPORT_WAIT_S = 2.0
"""Longest a failing record waits for the watch thread to read how the engine process ended (its exit code)."""

_ASSUMED_MAX_NUM_SEQS = 256
"""vLLM's long-standing default for `max_num_seqs`, used for batcher settings before `load()`."""

_ASSUMED_TOKENS_PER_SEQ = 1024
"""KV-cache tokens per sequence assumed for batcher settings when vLLM has not reported its cache size."""


@dataclass(frozen=True)
class Limits:
    """What vLLM settled on at start-up: context length, sequences per step, KV-cache size."""

    max_model_len: int | None
    max_num_seqs: int
    kv_cache_tokens: int

    @classmethod
    def assumed(cls, engine_args: dict[str, Any]) -> Limits:
        max_num_seqs = engine_args.get("max_num_seqs") or _ASSUMED_MAX_NUM_SEQS
        return cls(engine_args.get("max_model_len"), max_num_seqs, max_num_seqs * _ASSUMED_TOKENS_PER_SEQ)

    @classmethod
    def read(cls, vllm_config: Any) -> Limits:
        """The limits vLLM settled on (after profiling memory for the KV cache)."""
        max_num_seqs = vllm_config.scheduler_config.max_num_seqs or _ASSUMED_MAX_NUM_SEQS
        cache = vllm_config.cache_config
        blocks, block_size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
        kv_cache_tokens = blocks * block_size if blocks and block_size else max_num_seqs * _ASSUMED_TOKENS_PER_SEQ
        return cls(vllm_config.model_config.max_model_len, max_num_seqs, kv_cache_tokens)


class VLLMSupport(Engine):
    """What both vLLM engines share: arguments, limits, sampling parameters, outputs, death.

    Args:
        model: A Hugging Face model id or local path, as vLLM takes it, or an object-store prefix
            (`s3://bucket/prefix`, `gs://`, `abfs://`) of a safetensors checkpoint, streamed at load
            (`streamed_engine_args`).
        generation: Default generation settings, mapped to `SamplingParams`.
        system_prompt: Prepended as a system message when the chat template is used.
        chat_template: Render records through the tokenizer's chat template; `None` means "when
            the tokenizer has one".
        model_name: The name results carry; by default the model reference.
        lora_modules: LoRA adapters by name (name -> PEFT adapter folder), as vLLM's `--lora-modules`:
            LoRA is enabled with a slot for each adapter and the largest rank among them, unless
            `enable_lora`, `max_loras` or `max_lora_rank` say otherwise (see `lora_engine_args`).
        **engine_args: vLLM engine arguments (`max_model_len`, `gpu_memory_utilization` or
            `kv_cache_memory_bytes`, `dtype`, `tensor_parallel_size`, `enforce_eager`, ...),
            checked at `load()` before vLLM starts; on CPU, defaults that fit are added.
    """

    name = "vllm"
    mode: VLLMMode = "batch"

    @with_engine_options
    def __init__(self, model: str, **engine_args: Any) -> None:
        super().__init__(**take_engine_options(engine_args))
        self.model = model
        self.source = model
        """What vLLM loads: `model`, or for a model in object storage the local folder of its config and tokenizer."""
        self.engine_args = dict(engine_args)
        self._lora_requests: dict[str, Any] = {}  # by adapter name, made at load
        self._limits: Limits | None = None
        self._vllm_config: Any = None
        self._verified: dict[GenerationConfig, str | None] = {}  # settings vLLM was asked to verify: its complaint
        self._dead = threading.Event()
        self._death = ""  # how the engine process ended, once it died (its exit code)
        self._death_known = threading.Event()  # set once the watch thread has read how the process ended
        self._watching = False  # a watch thread reads how the engine process ends (vLLM's internals allowed it)
        self._closing = threading.Event()  # set while closing: the engine process ending then is no death
        self._exit_grace_s = ENGINE_EXIT_GRACE_S  # 0 once this process exits (`_close_at_exit`)

    def _default_model_name(self) -> str:
        return model_display_name(self.model)

    def make_reasoning_parser(self, name: str, tokenizer: Any) -> ReasoningParser:
        """vLLM's reasoning parser `name` (any vLLM registers), as `vllm run-batch --reasoning-parser` uses it."""
        return vllm_reasoning_parser(name, tokenizer)

    @property
    def is_healthy(self) -> bool:
        """Whether the engine is loaded and its engine-core process is alive."""
        return self.is_loaded and not self._dead.is_set()

    def _resolved_engine_args(self, vllm: Any) -> dict[str, Any]:
        on_cpu = running_on_cpu()
        args = with_compact_json(with_device_defaults(self.engine_args, on_cpu=on_cpu))
        if self.lora_modules:
            args = lora_engine_args(args, self.lora_modules, on_cpu=on_cpu)
            from vllm.lora.request import LoRARequest

            self._lora_requests = {
                name: LoRARequest(name, number, path)
                for number, (name, path) in enumerate(self.lora_modules.items(), start=1)
            }
        check_engine_args(args, accepted_arguments(vllm, streaming=self.mode == "stream"), on_cpu=on_cpu)
        self.source = self.model
        if is_remote(self.model):
            streaming = streamed_engine_args(self.model)
            self.source = streaming.pop("model")
            args = {**args, **streaming}
        return args

    def _lora_request(self, prompt: PreparedPrompt) -> Any:
        """The prompt's `LoRARequest`, or `None` for the base model."""
        return self._lora_requests[prompt.adapter] if prompt.adapter is not None else None

    def _started(self, tokenizer: Any, vllm_config: Any) -> LoadedModel:
        """Remember what vLLM settled on; what `_load` returns."""
        self._vllm_config = vllm_config
        self._verified.clear()
        self._limits = Limits.read(vllm_config)
        # Known now, so that an engine that dies before its first step still reports its capacity.
        self._counters.set_capacity(self._limits.max_num_seqs)
        self._dead.clear()
        self._death = ""
        self._death_known.clear()
        self._closing.clear()
        # A process that ends with the engine loaded (a Flyte task returning, a script finishing)
        # shuts it down first, so its engine process is not reported as having died.
        atexit.register(_close_at_exit, weakref.ref(self))
        return LoadedModel(tokenizer, vllm_config.model_config.max_model_len)

    def _check_generation(self, generation: GenerationConfig) -> None:
        """Also ask vLLM whether it accepts a response format (its backend may refuse what xgrammar parses).

        vLLM validates a request when it is added, and `LLM.generate` fails a whole batch for one
        refused request; verifying each distinct setting here first makes the refusal that record's alone.
        """
        super()._check_generation(generation)
        if generation.response_format is None and not generation.logit_bias:
            return
        if generation not in self._verified:
            self._verified[generation] = verify_with_vllm(
                sampling_params(generation, final_only=self.mode == "stream"), self._vllm_config, self._tokenizer
            )
        problem = self._verified[generation]
        if problem is not None:
            fields = _verified_fields(generation)
            verb = "is" if len(fields) == 1 else "are"
            raise InvalidResponseFormatError(f"{' and '.join(fields)} {verb} refused by vLLM: {problem}")

    def _check_alive(self) -> None:
        if self._dead.is_set():
            raise self._dead_error("; the engine must be loaded again (SharedBatcher does so on its next get())")

    def _engine_died(self, how: str) -> None:
        """The engine-core process ended while loaded (`how`: its exit code), as the watch thread saw it."""
        self._death = how
        self._death_known.set()
        self._dead.set()

    def _watch(self, engine: Any) -> None:
        """Watch vLLM's engine-core process (`_engine_died` when it ends while loaded)."""
        self._watching = watch_engine_process(engine, self._closing, self.name, self._engine_died)

    def _dead_error(self, context: str = "") -> EngineDeadError:
        """The error every pending and later record fails with once the engine process died.

        It is the one report of the death: the batcher logs it as a single line, and vLLM's own
        traceback of it is dropped (`quiet_engine_death_tracebacks`).
        """
        self._dead.set()
        if self._watching and not self._closing.is_set():
            # vLLM may notice the death a moment before the watch thread has read the exit code: wait for it
            # (briefly: the process has ended), so that every record's error says how the process ended.
            self._death_known.wait(DEATH_REPORT_WAIT_S)
            self._death_known.set()  # waited once: later records do not wait again for a code that never came
        how = f" ({self._death})" if self._death else ""
        return EngineDeadError(f"{self.name}: the vLLM engine process died{how}{context}")

    def batcher_defaults(self) -> BatcherSettings:
        """Batcher settings from the limits vLLM settled on (assumed ones before `load()`).

        Stream mode: batches of one record dispatched at once, up to `max(1024, 4 * max_num_seqs)`
        requests in flight, estimated tokens in flight bounded at twice the KV cache but never below
        `2 * max_num_seqs` records of `max_model_len` (`stream_batcher_settings`). Batch mode:
        up to `max_num_seqs` records and a KV cache's worth of estimated tokens per batch, so that a
        batch never waits inside vLLM for cache space, records that share a prompt prefix in the same
        batch (`grouping="by_prefix"`: vLLM computes the prefix once for all of them, even in one step;
        8 documents asked 4 questions each on the CPU build, with a cache too small for them all, ran
        in 7.1 s where submission order took 11.3 s).
        """
        limits = self._limits or Limits.assumed(self.engine_args)
        if self.mode == "stream":
            return stream_batcher_settings(limits.max_num_seqs, limits.kv_cache_tokens, limits.max_model_len)
        return BatcherSettings(
            max_batch_size=limits.max_num_seqs, target_batch_cost=limits.kv_cache_tokens, grouping="by_prefix"
        )


class VLLMEngine(VLLMSupport, BatchEngine):
    """Generates with vLLM's offline `LLM`, a whole batch per call (`mode="batch"`).

    vLLM is imported on `load()`, so this module imports without it. `VLLMStreamEngine` is the
    streaming alternative; `create_engine("vllm", mode=...)` picks either.

    It cannot stop a running record: `LLM.generate` runs its whole batch, so a record cancelled
    while it runs (`Request.cancellation`) is generated to its end and its answer dropped (one
    cancelled before its batch starts never runs). It answers whole records: a `Request.on_delta`
    listener is never called.

    Args:
        model: A Hugging Face model id or local path.
        **kwargs: See `VLLMSupport`.

    Example:
        ```python
        engine = VLLMEngine("HuggingFaceTB/SmolLM2-360M-Instruct", max_model_len=4096)
        engine.load()
        async with engine.batcher() as batcher:
            answers = await batcher.run(["What is 2 + 2?", "Name a prime above 10."])
        print(engine.stats.completion_tokens_per_s)
        ```
    """

    mode: VLLMMode = "batch"

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._llm: Any = None
        self._llm_lock = threading.Lock()  # vLLM's offline LLM is not thread-safe: batches take turns

    def _load(self) -> LoadedModel:
        vllm = import_vllm()
        from flyteplugins_batcher.engines.vllm._steps import record_offline_steps

        args = {"disable_log_stats": False, **self._resolved_engine_args(vllm)}  # stats give steps and occupancy
        with config_errors(self.model):
            self._llm = vllm.LLM(self.source, **args)
        if not args["disable_log_stats"]:
            record_offline_steps(self._llm, self._counters.count_step)
        loaded = self._started(self._llm.get_tokenizer(), self._llm.llm_engine.vllm_config)
        self._watch(self._llm)
        return loaded

    def _close(self) -> None:
        self._closing.set()
        llm, self._llm = self._llm, None
        if llm is not None:
            shutdown_offline(llm, self._exit_grace_s)
        self._limits = self._vllm_config = None
        release_cuda_memory()

    def _run(self, prompts: list[PreparedPrompt]) -> list[Outcome]:
        from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

        self._check_alive()
        params = [sampling_params(prompt.generation) for prompt in prompts]
        adapters = [self._lora_request(prompt) for prompt in prompts] if self._lora_requests else None
        try:
            with self._llm_lock:
                outputs = self._llm.generate(
                    [{"prompt_token_ids": prompt.token_ids} for prompt in prompts],
                    params,
                    use_tqdm=False,
                    lora_request=adapters,
                )
        except VLLMEngineDeadError as error:
            raise self._dead_error(" during a batch") from error
        return [
            completion(output, len(prompt.token_ids), prompt.generation, self._tokenizer)
            for prompt, output in zip(prompts, outputs, strict=True)
        ]


# -- shared helpers --------------------------------------------------------------------------------


def _verified_fields(generation: GenerationConfig) -> list[str]:
    """The fields vLLM was asked to verify, named as the request named them (for messages)."""
    fields = [] if generation.response_format is None else [generation.response_format.label]
    if generation.logit_bias:
        fields.append(f"logit_bias {dict(generation.logit_bias)}")
    return fields


def import_vllm() -> Any:
    """`vllm`, or an `ImportError` that says how to install it (its GPU or CPU build)."""
    _install.require_vllm()
    try:
        import vllm
    except ImportError as error:  # installed, but broken (PyPI's torchvision beside the CPU build, say)
        raise _install.not_installed("vllm", ["vllm"], _install.VLLM) from error
    return vllm


@contextmanager
def config_errors(model: str) -> Iterator[None]:
    """Turn vLLM's configuration errors into `EngineConfigError`.

    vLLM validates its configuration in this process and raises `ValueError`/`TypeError` (a
    pydantic `ValidationError` is a `ValueError`) before the engine core starts; those cannot heal
    by retrying. Failures inside the engine core arrive as `RuntimeError` and are left alone.
    """
    try:
        yield
    except EngineConfigError:
        raise
    except (ValueError, TypeError) as error:
        raise EngineConfigError(f"vllm cannot serve {model!r} with these settings: {error}") from error


@functools.lru_cache(maxsize=256)
def sampling_params(config: GenerationConfig, final_only: bool = False, deltas: bool = False) -> Any:
    """`SamplingParams` for a `GenerationConfig` (cached: most records share a handful of settings).

    `final_only`: only the finished output is sent; `deltas`: each output carries only the new
    tokens and text (for streaming them); neither: vLLM's default, each output all so far.
    """
    from vllm import SamplingParams

    options: dict[str, Any] = {
        "n": config.decoded_samples,  # vLLM refuses n > 1 when greedy: one sample is decoded and repeated
        "temperature": config.temperature,
        "top_p": config.top_p,
        "seed": config.seed,
        "max_tokens": config.max_new_tokens,
        "stop": list(config.stop),
        "logprobs": config.logprobs,
        "presence_penalty": config.presence_penalty,
        "frequency_penalty": config.frequency_penalty,
        "logit_bias": dict(config.logit_bias) or None,
    }
    if config.response_format is not None:
        options["structured_outputs"] = structured_outputs(config.response_format)
    if final_only or deltas:
        from vllm.sampling_params import RequestOutputKind

        # Only the finished output is used, unless the text is streamed: skipping per-token outputs
        # saves a wake-up per token.
        options["output_kind"] = RequestOutputKind.DELTA if deltas else RequestOutputKind.FINAL_ONLY
    return SamplingParams(**options)


def structured_outputs(response_format: ResponseFormat) -> Any:
    """vLLM's `StructuredOutputsParams` for a response format."""
    from vllm.sampling_params import StructuredOutputsParams

    kind = response_format.kind
    if kind == "regex":
        return StructuredOutputsParams(regex=response_format.pattern)
    if kind == "choice":
        return StructuredOutputsParams(choice=list(response_format.options))
    if kind == "grammar":
        return StructuredOutputsParams(grammar=response_format.rules)
    if response_format.schema is None:
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(json=response_format.schema)


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM sizes its LoRA slots for (`max_lora_rank`)."""


def streamed_engine_args(uri: str) -> dict[str, Any]:
    """vLLM's `model` and load arguments for a checkpoint in object storage, checked first (`StoredModel.check`).

    With `flyteplugins-vllm` installed, its `flyte-streaming` load format (`model_streamer.engine_args`): the
    config and tokenizer in the replica's cache, the weights streamed by `ModelStreamer` in vLLM's engine
    process, never written to disk (it sets `VLLM_WORKER_MULTIPROC_METHOD=spawn`: the store's client does not
    survive a fork). Without it, the whole checkpoint is downloaded to the cache first, and a warning says so.

    Raises:
        EngineConfigError: The store cannot be read, or the prefix holds no checkpoint.
    """
    stored = StoredModel(uri)
    stored.check()
    try:
        from flyteplugins.vllm.model_streamer import engine_args
    except ImportError:
        logger.warning("%s: downloading the whole model first: pip install flyteplugins-vllm streams it", uri)
        return {"model": str(stored.download())}
    folder = stored.cache_folder() / "vllm"
    return stored.read(engine_args(uri, local_dir=folder))


def lora_engine_args(engine_args: dict[str, Any], lora_modules: dict[str, str], *, on_cpu: bool) -> dict[str, Any]:
    """`engine_args` with LoRA enabled for these adapters (each folder checked first).

    A slot per adapter (`max_loras`), so that every adapter can run in the same step, and
    `max_lora_rank` the smallest of vLLM's ranks that holds the largest adapter. On CPU, one slot
    more, left empty: vLLM's CPU kernels pick a base-model row's LoRA weights at slot index -1,
    which is the last slot, so a base-model row beside adapter rows is answered by whichever
    adapter holds that slot; an empty one adds nothing, and base rows come out as the base model's.

    Raises:
        EngineConfigError: An adapter folder that is not a LoRA adapter, or a rank vLLM cannot hold.
    """
    args = dict(engine_args)
    configs = checked_adapters(lora_modules)
    rank = max(lora_rank(config) for config in configs.values())
    fitting = [allowed for allowed in LORA_RANKS if allowed >= rank]
    if not fitting:
        raise EngineConfigError(f"vllm: LoRA rank {rank} is above the largest vLLM holds ({LORA_RANKS[-1]})")
    args.setdefault("enable_lora", True)
    args.setdefault("max_lora_rank", fitting[0])
    slots = len(configs) + (1 if on_cpu else 0)
    args["max_loras"] = max(int(args.get("max_loras") or 1), slots) if on_cpu else args.get("max_loras", slots)
    if args.get("max_cpu_loras") is not None:
        args["max_cpu_loras"] = max(int(args["max_cpu_loras"]), args["max_loras"])
    return args


def verify_with_vllm(params: Any, vllm_config: Any, tokenizer: Any) -> str | None:
    """What vLLM says is wrong with `params` (as it checks a request when it is added), or None."""
    try:
        params.verify(
            vllm_config.model_config,
            vllm_config.speculative_config,
            vllm_config.structured_outputs_config,
            tokenizer,
        )
    except Exception as error:  # vLLM's validation errors are ValueError or its own VLLMValidationError
        return str(error) or type(error).__name__
    return None


def completion(output: Any, prompt_tokens: int, config: GenerationConfig, tokenizer: Any) -> Completion | Exception:
    """A `Completion` of `config.n` samples from vLLM's final `RequestOutput`, or the error for an aborted request.

    A greedy request decodes one sample (see `sampling_params`), which is repeated `n` times. Its
    tokens' logprobs come along when `config.logprobs` asked for them (`token_logprobs`). Its
    `cached_tokens` are vLLM's `num_cached_tokens`: prompt tokens found in its prefix cache (`None`: 0).
    """
    samples = []
    n = config.n
    for choice in sorted(output.outputs, key=lambda choice: choice.index):
        finish_reason = _FINISH_REASONS.get(choice.finish_reason or "")
        if finish_reason is None:
            return RuntimeError(f"vllm: request {output.request_id} ended with finish_reason={choice.finish_reason!r}")
        logprobs = None
        if config.logprobs is not None:
            logprobs = token_logprobs(choice.token_ids, choice.logprobs or [], config.logprobs, tokenizer)
        stop_reason = choice.stop_reason if isinstance(choice.stop_reason, str) else None  # a stop string's, not EOS
        samples.append(
            Sample(
                choice.text,
                len(choice.token_ids),
                finish_reason,
                logprobs,
                stop_reason,
                token_ids=tuple(choice.token_ids),
            )
        )
    if len(samples) == 1:
        samples *= n
    if len(samples) != n:
        return RuntimeError(f"vllm: request {output.request_id} returned {len(samples)} samples, not {n}")
    return Completion.from_samples(prompt_tokens, samples, cached_tokens=output.num_cached_tokens or 0)


def token_logprobs(token_ids: Any, steps: Any, top: int, tokenizer: Any) -> tuple[TokenLogprob, ...]:
    """Each generated token's `TokenLogprob` from vLLM's per-step `{token_id: Logprob}`.

    A step holds the sampled token and the `top` most likely (vLLM ranks them from 1); the
    alternatives are the `top` best by rank. A token vLLM left undecoded is decoded alone.
    """
    shaped = []
    for token_id, step in zip(token_ids, steps, strict=False):
        chosen = step.get(token_id) if step else None
        if chosen is None:  # vLLM gave no logprob for the token: as vLLM writes it, the floor
            shaped.append(TokenLogprob(_decoded(tokenizer, token_id, None), LOGPROB_FLOOR))
            continue
        ranked = sorted(
            ((entry.rank, other) for other, entry in step.items() if entry.rank is not None and entry.rank <= top),
            key=lambda pair: pair[0],
        )
        alternatives = tuple(
            (_decoded(tokenizer, other, step[other].decoded_token), max(step[other].logprob, LOGPROB_FLOOR))
            for _, other in ranked[:top]
        )
        token = _decoded(tokenizer, token_id, chosen.decoded_token)
        shaped.append(TokenLogprob(token, max(chosen.logprob, LOGPROB_FLOOR), alternatives))
    return tuple(shaped)


def _decoded(tokenizer: Any, token_id: int, decoded: str | None) -> str:
    return decoded if decoded is not None else str(tokenizer.decode([token_id]))


def engine_core_client(engine: Any) -> Any:
    """vLLM's client to its engine-core process, for `LLM` (batch) and `AsyncLLM` (stream) alike."""
    llm_engine = getattr(engine, "llm_engine", engine)
    return getattr(llm_engine, "engine_core", None)


def watch_engine_process(engine: Any, closing: threading.Event, owner: str, on_death: Callable[[str], None]) -> bool:
    """Notice the engine-core process dying, call `on_death` with its exit codes, and unblock a waiting batch.

    vLLM's own monitor marks the client dead but leaves `LLM.generate` blocked forever on an
    output queue nobody feeds any more; putting vLLM's `EngineDeadError` there makes it raise. Uses
    vLLM internals (0.10+); where they are missing, death is only noticed by the next call. Logs
    nothing: the records' `EngineDeadError` is the report.
    """
    client = engine_core_client(engine)
    manager = getattr(getattr(client, "resources", None), "engine_manager", None)
    sentinels = getattr(manager, "sentinels", None)
    if not callable(sentinels):
        logger.warning("%s: cannot watch the vLLM engine process (unknown vLLM internals)", owner)
        return False
    watched = list(sentinels())

    def wait_for_death() -> None:
        ended = multiprocessing.connection.wait(watched)
        if closing.is_set():
            return
        on_death(_exit_codes(getattr(manager, "processes", ()), ended))
        outputs = getattr(client, "outputs_queue", None)
        if outputs is not None and hasattr(outputs, "put_nowait") and not hasattr(outputs, "_loop"):
            from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

            outputs.put_nowait(VLLMEngineDeadError())

    threading.Thread(target=wait_for_death, daemon=True, name=f"{owner}-engine-watch").start()
    return True


def _exit_codes(processes: Any, ended: list[Any]) -> str:
    """`"EngineCore exit code -9"`: how the engine processes whose sentinels are in `ended` ended."""
    codes = []
    for process in processes:
        if getattr(process, "sentinel", None) in ended:
            codes.append(f"{process.name} exit code {_exit_code(process)}")
    return ", ".join(codes)


def _exit_code(process: Any, timeout_s: float = 1.0) -> int | None:
    """The exit code of a process whose sentinel fired, once it is known (`None` after `timeout_s`).

    The sentinel fires a moment before the process can be reaped. vLLM's own monitor thread reaps it
    too: when it wins the race, this thread's `join` returns with no code, and the code appears once
    vLLM's thread has stored it on the process object.
    """
    deadline = time.monotonic() + timeout_s
    process.join(timeout=timeout_s)
    while process.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return process.exitcode


class _EngineDeathTraceback(logging.Filter):
    """Drops a vLLM log record that carries vLLM's `EngineDeadError` (its output handler's traceback).

    The death is reported once, by the records' own `EngineDeadError`; what killed the engine, if
    it crashed rather than being killed, is logged by its own process.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

        return not (record.exc_info and isinstance(record.exc_info[1], VLLMEngineDeadError))


_ENGINE_DEATH_TRACEBACK = _EngineDeathTraceback()


def quiet_engine_death_tracebacks() -> None:
    """Keep `AsyncLLM`'s output handler from logging a traceback when its engine process dies (idempotent)."""
    logging.getLogger("vllm.v1.engine.async_llm").addFilter(_ENGINE_DEATH_TRACEBACK)


def _close_at_exit(engine_ref: weakref.ref[VLLMSupport]) -> None:
    """Close an engine still loaded as this process exits, as `vllm run-batch` does (vLLM's `shutdown_timeout` 0):
    its engine process is killed at once, since what it holds goes with it and no one waits for it any more."""
    engine = engine_ref()
    if engine is not None and engine.is_loaded:
        engine._closing.set()
        engine._exit_grace_s = 0.0
        engine.close()


def shutdown_offline(llm: Any, grace_s: float = ENGINE_EXIT_GRACE_S) -> None:
    """Stop the engine-core process behind a `vllm.LLM` (best effort: its API is internal)."""
    shutdown = getattr(engine_core_client(llm), "shutdown", None)
    if callable(shutdown):
        shutdown(timeout=grace_s)


def release_cuda_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")  # vLLM imported it if it ran; never import torch just to clean up
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
