"""`EngineSettings`: what a replica's engine and shared batcher are built from, and the engine's keywords.

The jobs take its fields as inputs of their own (`flyteplugins_batcher/jobs/_options.py`) and the server as
settings and flags: a field added here, with its help, is an option of each of them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from flyteplugins_batcher.engines import EmbeddingModel, EngineConfigError, GenerationConfig
from flyteplugins_batcher.engines.vllm import parse_engine_args
from flyteplugins_batcher.replica._models import ServedModel, model_references, served_models


@dataclass(frozen=True)
class EngineSettings:
    """Engine, generation and batcher settings: what the replica's shared engine is keyed on.

    Every LLM workflow takes them as inputs of their own (`flyteplugins_batcher/jobs/_options.py`): a field added
    here, with its help below, is an option of each of them. Zero or empty means "the engine's
    default". The vLLM fields apply to `engine="vllm"` (or "auto" on a GPU).

    Attributes:
        engine: "auto" (vLLM on a GPU, else Transformers), "vllm", "transformers", "simulated"
            (no model: vLLM's scheduling with an H100's step times, to dry-run capacity planning;
            its options as engine_args, e.g. {"time_scale": 4, "gpu": {"max_num_seqs": 1024},
            "output_lengths": {"mean": 200, "long_fraction": 0.05}}), or "openai" (each request sent to
            the OpenAI-compatible endpoint at base_url, the key from OPENAI_API_KEY; its options as
            engine_args, e.g. {"requests_per_minute": 500, "tokens_per_minute": 200000, "timeout_s": 60,
            "max_retries": 5, "max_concurrency": 256, "api_key_env": "MY_KEY"}).
        model: Hub id, local path, or an object-store prefix of a safetensors checkpoint (s3://bucket/prefix,
            gs://, abfs://: its weights stream to the device, its tokenizer and config are cached on the
            replica); empty for the bundled SmolLM2-135M-Instruct; for engine "openai", the endpoint's model
            (empty: the first its /v1/models lists). Several (one a line, or
            separated by commas; --model given more than once) for a batch file whose lines name different
            base models: each model's lines run on the replicas in turn, each replica loading a model once
            and closing it before the next (run-batch; a replica, run-table and the server take one).
        base_url: The OpenAI-compatible endpoint engine "openai" sends requests to, /v1 included
            (http://host:8000/v1).
        vllm_mode: "stream" (the default: each prompt is its own request to vLLM's continuous
            batching) or "batch" (whole batches through `LLM.generate`).
        max_model_len: vLLM's context length (0: the model's).
        kv_cache_gb: vLLM's KV cache in GiB (0: 2 GiB at most on CPU, vLLM's default on GPU).
        gpu_memory_utilization: vLLM's share of GPU memory (on CPU: of host memory), instead of
            kv_cache_gb.
        dtype: Model dtype ("float32", "bfloat16", ...; empty: the engine's choice for the device).
        tensor_parallel_size: GPUs per replica for vLLM (0: one).
        enforce_eager: "true" to skip vLLM's graph compilation (empty: the default for the device).
        engine_args: Any other vLLM engine argument (or the simulated engine's options), as a JSON object.
        lora_modules: LoRA adapters served beside the model, as vLLM's --lora-modules takes them:
            name=path pairs (separated by spaces or new lines), or JSON objects {"name": ..., "path": ...};
            a request whose model names one runs with it (vLLM and Transformers; LoRA is enabled for it).
            With several models, an adapter runs on the one its "base_model_name" names, else the one its
            adapter_config.json was trained on, else the first.
        models_per_replica: Base models a replica may hold loaded at once, when the run names several: 1 (one
            at a time, each closed before the next loads); more when that many fit in a replica's memory, and
            that many models' lines run side by side.
        tool_call_parser: How tool_choice "auto" finds tool calls in the text, as vLLM's --tool-call-parser:
            "hermes" or "llama3_json"; empty: a request asking for "auto" fails, saying so.
        reasoning_parser: Take a reasoning model's thinking out of its answers, as vLLM's --reasoning-parser: into
            message.reasoning_content (and .reasoning), counted in usage.completion_tokens_details.reasoning_tokens;
            vLLM's parsers on the vllm engine, "deepseek_r1" and "qwen3" (their think tags) on the others;
            empty: none.
        system_prompt: Added to prompts that do not bring their own system message.
        max_new_tokens: Generation budget per answer (a request's own max_tokens wins).
        temperature: 0 for greedy decoding (a request's own temperature wins).
        top_p: Nucleus-sampling mass, when sampling (a request's own top_p wins).
        seed: Seed for sampling, so that a sampled run can be repeated (a request's own seed wins).
        target_batch_tokens: Token budget per batch (0: the engine's default).
        max_batch_size: Records per batch (0: the engine's default).
        batch_timeout_s: Longest a prompt waits for its batch to fill.
        max_queue_size: Prompts that may wait in the replica's queue (0: the batcher's default, 5000); a
            server answers 429 past it.
        latency_slo_s: The batcher's latency target instead of its knobs (0: none): seconds from a
            prompt's submit to its answer that the p99 of prompts must meet; the batcher then chooses
            its batch size, wait and work in flight from a model of batch time it learns as it runs,
            with `target_batch_tokens` and `max_batch_size` as bounds (`BatcherSettings.latency_slo_s`).
            For records that arrive over time; a job that submits a whole file at once gains nothing
            from it. In a server it is the online requests' target only (batch lines have none).
    """

    engine: str = "auto"
    model: str = ""
    base_url: str = ""
    vllm_mode: str = ""
    max_model_len: int = 0
    kv_cache_gb: float = 0.0
    gpu_memory_utilization: float = 0.0
    dtype: str = ""
    tensor_parallel_size: int = 0
    enforce_eager: str = ""
    engine_args: str = ""
    lora_modules: str = ""
    models_per_replica: int = 1
    tool_call_parser: str = ""
    reasoning_parser: str = ""
    system_prompt: str = ""
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    target_batch_tokens: int = 0
    max_batch_size: int = 0
    batch_timeout_s: float = 0.05
    max_queue_size: int = 0
    latency_slo_s: float = 0.0

    def __post_init__(self) -> None:
        if self.models_per_replica < 1:
            raise ValueError(f"models_per_replica must be >= 1, got {self.models_per_replica}")

    def batcher_keywords(self) -> dict[str, Any]:
        """The replica batcher's keywords these settings give, over the engine's defaults (`engine.batcher(**...)`)."""
        # "split": a record that breaks a whole batch must not fail the other tasks' records batched with it.
        keywords: dict[str, Any] = {"batch_timeout_s": self.batch_timeout_s, "on_error": "split", "name": "llm"}
        given = ("target_batch_tokens", "max_batch_size", "max_queue_size", "latency_slo_s")  # 0: the engine's default
        return keywords | {name: getattr(self, name) for name in given if getattr(self, name)}

    def adapters(self) -> dict[str, str]:
        """The LoRA adapters `lora_modules` names, name -> path, in the order given.

        Raises:
            EngineConfigError: An entry that is neither `name=path` nor a JSON object with a name and a path.
        """
        return parse_lora_modules(self.lora_modules)

    def base_models(self) -> list[str]:
        """The base models `model` declares, in order (`[""]`: the bundled model)."""
        return model_references(self.model)

    def served_models(self, served_model_name: str = "") -> tuple[ServedModel, ...]:
        """The base models `model` declares, in order, each with the names a line may give it and its adapters.

        Args:
            served_model_name: The first model's name in result lines (empty: its reference as declared).

        Raises:
            EngineConfigError: A model declared twice, a name two of them share, an adapter's unknown base.
        """
        entries = _lora_entries(self.lora_modules)
        adapters = {name: path for name, path, _ in entries}
        bases = {name: base for name, _, base in entries if base}
        return served_models(self.base_models(), adapters, bases, served_model_name)

    def for_model(self, model: ServedModel) -> EngineSettings:
        """The settings `model`'s engine is built with: these when they declare one model, else with `model` and
        only its own adapters (a chunk's settings: the replica's engine, and Flyte's cache, are keyed on them)."""
        if len(self.base_models()) == 1:
            return self
        return replace(self, model=model.reference, lora_modules=model.lora_modules())

    def classifier_tasks(self) -> tuple[str, ...]:
        """What the model does when it is a sequence classifier rather than a text generator (a cross-encoder:
        `("score", "rerank", "classify")`; more labels: `("classify",)`); empty for an LLM. Reads its config only.

        A classifier runs as an encoder (`EmbeddingReplica.for_settings`), on Transformers or vLLM's pooling
        runner, and answers score, rerank and classify lines; it must be the run's only model.

        Raises:
            EngineConfigError: A classifier among several models.
        """
        references = self.base_models()
        if self.engine == "simulated" or references == [""]:
            return ()
        tasks = [EmbeddingModel(reference).tasks for reference in references]
        if any("classify" in done for done in tasks) and len(references) > 1:
            raise EngineConfigError("a classifier (cross-encoder) must be the run's only model")
        return tasks[0] if "classify" in tasks[0] else ()

    def generation(self) -> GenerationConfig:
        """The run's default generation settings (requests may set their own).

        Raises:
            ValueError: A setting is out of range.
        """
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed
        )


_VLLM_ONLY = ("vllm_mode", "max_model_len", "kv_cache_gb", "gpu_memory_utilization", "tensor_parallel_size")


_NOT_SIMULATED = (*_VLLM_ONLY, "dtype", "enforce_eager")


_LORA_PAIR = re.compile(r"^([^=\s]+)=(\S.*)$")


def parse_lora_modules(text: str) -> dict[str, str]:
    """Adapters by name from vLLM's `--lora-modules` forms, one or more to a line: `name=path` pairs, a JSON object
    `{"name", "path"}` per line, or a JSON list of such objects.

    Raises:
        EngineConfigError: Naming the entry that is neither, or a name given twice.

    Example:
        ```python
        assert parse_lora_modules("sql=/lora/sql chat=/lora/chat") == {"sql": "/lora/sql", "chat": "/lora/chat"}
        ```
    """
    return {name: path for name, path, _ in _lora_entries(text)}


def _lora_entries(text: str) -> list[tuple[str, str, str]]:
    """Each adapter's name, path and base model (vLLM's `base_model_name`; empty when not given), in order."""
    text = text.strip()
    if text.startswith("["):
        entries: list[Any] = _json_entry(text)
    else:
        entries = []
        for line in filter(None, (line.strip() for line in text.splitlines())):
            entries += [_json_entry(line)] if line.startswith("{") else line.split()
    adapters: dict[str, tuple[str, str, str]] = {}
    for entry in entries:
        name, path, base = _lora_entry(entry)
        if name in adapters:
            raise EngineConfigError(f"lora_modules names the adapter {name!r} twice")
        adapters[name] = (name, path, base)
    return list(adapters.values())


def _json_entry(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise EngineConfigError(f"lora_modules: {text!r} is not JSON: {error}") from None


def _lora_entry(entry: Any) -> tuple[str, str, str]:
    if isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("path"), str):
        base = entry.get("base_model_name")
        return entry["name"], entry["path"], base if isinstance(base, str) else ""
    match = _LORA_PAIR.match(entry) if isinstance(entry, str) else None
    if match is None:
        raise EngineConfigError(
            f'lora_modules: {entry!r} is neither name=path nor {{"name": ..., "path": ...}} (as vLLM takes them)'
        )
    return match.group(1), match.group(2), ""


def engine_kwargs(settings: EngineSettings) -> dict[str, Any]:
    """`create_engine` keywords for the settings: the vLLM ones only for vLLM, `engine_args` as options for "simulated"
    and "openai" (with its `base_url`).

    Raises:
        EngineConfigError: A vLLM-only setting given for another engine, or bad JSON in `engine_args`.
    """
    if settings.engine == "simulated":
        given = [name for name in _NOT_SIMULATED if getattr(settings, name)]
        if given:
            raise EngineConfigError(
                f"{', '.join(given)} do not apply to engine='simulated' (give its options as engine_args)"
            )
        return _with_adapters(parse_engine_args(settings.engine_args), settings)
    if settings.base_url and settings.engine != "openai":
        raise EngineConfigError(f"base_url applies to engine='openai' only, not {settings.engine!r}")
    if settings.engine == "openai":
        given = [name for name in (*_NOT_SIMULATED, "lora_modules") if getattr(settings, name)]
        if given:
            raise EngineConfigError(f"{', '.join(given)} do not apply to engine='openai' (the endpoint runs the model)")
        if not settings.base_url:
            raise EngineConfigError("engine='openai' needs base_url: the endpoint's API root, like http://host:8000/v1")
        return {**parse_engine_args(settings.engine_args), "base_url": settings.base_url}
    if settings.engine == "transformers":
        given = [name for name in _VLLM_ONLY if getattr(settings, name)] + (
            ["engine_args"] if settings.engine_args else []
        )
        if given:
            raise EngineConfigError(f"{', '.join(given)} apply to engine='vllm' only, not 'transformers'")
        return _with_adapters({"dtype": settings.dtype} if settings.dtype else {}, settings)
    kwargs: dict[str, Any] = parse_engine_args(settings.engine_args)
    explicit = {
        "mode": settings.vllm_mode,
        "max_model_len": settings.max_model_len,
        "kv_cache_memory_bytes": int(settings.kv_cache_gb * 2**30),
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "dtype": settings.dtype,
        "tensor_parallel_size": settings.tensor_parallel_size,
    }
    kwargs.update({name: value for name, value in explicit.items() if value})
    if settings.enforce_eager:
        kwargs["enforce_eager"] = settings.enforce_eager.strip().lower() in ("1", "true", "yes")
    return _with_adapters(kwargs, settings)


def _with_adapters(kwargs: dict[str, Any], settings: EngineSettings) -> dict[str, Any]:
    adapters = settings.adapters()
    return {**kwargs, "lora_modules": adapters} if adapters else kwargs
