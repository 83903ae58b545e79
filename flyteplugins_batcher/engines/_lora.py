"""LoRA adapters as engines load them: a name for each PEFT adapter folder, checked before the model starts.

vLLM's `--lora-modules name=path` gives each adapter the name a request's `model` picks it by; the
engines take the same mapping (`lora_modules`). An adapter folder holds PEFT's `adapter_config.json`
and its weights; its rank (`r`) sizes vLLM's LoRA slots.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flyteplugins_batcher.engines._engine_errors import EngineConfigError, ModelNotFoundError


def adapter_config(name: str, path: str) -> dict[str, Any]:
    """The PEFT configuration of adapter `name` in folder `path`.

    Raises:
        ModelNotFoundError: Nothing is at `path`.
        EngineConfigError: It is not a PEFT LoRA adapter folder (no readable `adapter_config.json`).
    """
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ModelNotFoundError(f"LoRA adapter {name!r}: nothing at {path!r}")
    try:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise EngineConfigError(
            f"LoRA adapter {name!r}: {path!r} is not a PEFT adapter folder (adapter_config.json: {error})"
        ) from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        kind = config.get("peft_type") if isinstance(config, dict) else config
        raise EngineConfigError(f"LoRA adapter {name!r}: {path!r} holds a {kind!r} adapter, not LoRA")
    return config


def lora_rank(config: Mapping[str, Any]) -> int:
    """The largest rank an adapter uses (`r`, or a larger one in its `rank_pattern`)."""
    pattern = config.get("rank_pattern") or {}
    ranks = [int(config.get("r") or 8), *(int(rank) for rank in pattern.values())]
    return max(ranks)


def checked_adapters(lora_modules: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Each adapter's configuration, every folder checked (see `adapter_config`).

    Raises:
        EngineConfigError: An adapter without a name, or whose folder is not a LoRA adapter.
    """
    configs = {}
    for name, path in lora_modules.items():
        if not isinstance(name, str) or not name.strip():
            raise EngineConfigError(f"a LoRA adapter needs a name, got {name!r} for {path!r}")
        configs[name] = adapter_config(name, path)
    return configs
