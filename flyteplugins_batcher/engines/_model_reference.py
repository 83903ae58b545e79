"""Early checks on a model reference, so a typo fails at construction rather than deep inside a loader."""

from __future__ import annotations

import os
import re
from pathlib import Path

from flyteplugins_batcher.engines._engine_errors import InvalidModelReferenceError, ModelNotFoundError
from flyteplugins_batcher.engines._object_store import is_remote

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def check_model_reference(model: str | os.PathLike[str]) -> None:
    """Fail fast on a model reference that is neither an existing path, an object-store URI nor a possible hub id.

    Whether a hub id exists (or is cached, when offline) is only known when the model loads.

    Raises:
        ModelNotFoundError: It looks like a filesystem path, and nothing is there (a `FileNotFoundError`).
        InvalidModelReferenceError: It is not a valid Hugging Face hub id either (a `ValueError`).

    Example:
        ```python
        check_model_reference("HuggingFaceTB/SmolLM2-135M-Instruct")  # fine: a plausible hub id
        check_model_reference("./models/missing")  # FileNotFoundError
        ```
    """
    text = os.fspath(model)
    if is_remote(text) or Path(text).expanduser().exists():
        return  # an object store's prefix is checked when it loads (`StoredModel.check`), before any inference
    looks_like_path = text.startswith(("/", ".", "~")) or text.endswith(".gguf") or text.count("/") > 1 or "\\" in text
    if looks_like_path:
        raise ModelNotFoundError(
            f"model path {text!r} does not exist: pass an existing local model directory (or .gguf file), "
            "a Hugging Face hub id like 'org/name', an object-store prefix like 's3://bucket/model', "
            "or no model for the bundled SmolLM2"
        )
    if not _HUB_ID.match(text) or "--" in text or ".." in text:
        raise InvalidModelReferenceError(
            f"model {text!r} is neither an existing path nor a Hugging Face hub id like 'org/name'"
        )


def hub_offline() -> bool:
    """Whether `HF_HUB_OFFLINE` is set, so that only locally cached hub models can load."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def model_display_name(model: str | os.PathLike[str] | None) -> str:
    """The short name results carry for a model reference: the bundled model's name, a path's last
    part, or a hub id as given.

    Example:
        ```python
        assert model_display_name("/models/Qwen2.5-1.5B-Instruct/") == "Qwen2.5-1.5B-Instruct"
        assert model_display_name("HuggingFaceTB/SmolLM2-360M-Instruct") == "HuggingFaceTB/SmolLM2-360M-Instruct"
        ```
    """
    if model is None:
        from flyteplugins_batcher.engines._smollm2 import BUNDLED_MODEL_NAME

        return BUNDLED_MODEL_NAME
    text = os.fspath(model)
    looks_like_path = text.startswith(("/", ".", "~")) or "\\" in text or text.count("/") > 1 or Path(text).exists()
    return Path(text.rstrip("/")).name if looks_like_path else text
