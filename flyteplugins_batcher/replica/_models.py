"""The base models a run serves: one, or several that time-share the replicas (`EngineSettings.model` naming more).

A batch file whose lines name different base models runs each model's lines in turn on the replicas
(the JSONL job), each replica loading a model once and closing it before the next. Here is what a
line's `model` may say and which engine answers it: each base model answers to its name (the one
result lines carry: `served_model_name`, else its reference as declared, as `vllm run-batch` echoes `--model`),
to its reference and to its short name; each LoRA adapter belongs
to one base model and runs on its engine.

An adapter's base is the `base_model_name` its `--lora-modules` JSON entry gives (vLLM's field),
else the model its own `adapter_config.json` was trained on (`base_model_name_or_path`) when that is
a declared model, else the first declared model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from flyteplugins_batcher.engines import EngineConfigError, model_display_name

_SEPARATOR = re.compile(r"[\n,]")


def model_references(text: str) -> list[str]:
    """The base models `EngineSettings.model` declares, in order: one a line or separated by commas.

    `[""]` (the bundled model) when it names none.

    Example:
        ```python
        assert model_references("org/a,\\n/models/b") == ["org/a", "/models/b"]
        ```
    """
    return [part.strip() for part in _SEPARATOR.split(text) if part.strip()] or [""]


@dataclass(frozen=True)
class ServedModel:
    """One base model of a run: what it loads, the names a line may give it, and its LoRA adapters.

    Attributes:
        reference: Hub id or local path, as declared (empty: the bundled model).
        name: Its name in result lines (`served_model_name` for the first model, else its reference as declared,
            as vLLM echoes `--model`; the bundled model's short name).
        aliases: The other names a line may give it: its reference, its short name.
        adapters: Its LoRA adapters, (name, path) pairs; a line naming one runs on this model's engine.

    Example:
        ```python
        [first, second] = EngineSettings(model="org/a\\n/models/b").served_models()
        assert second.name == "/models/b" and "b" in second.aliases
        ```
    """

    reference: str
    name: str
    aliases: tuple[str, ...] = ()
    adapters: tuple[tuple[str, str], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a line may give it (its adapters' aside)."""
        return (self.name, *self.aliases)

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.adapters)

    def lora_modules(self) -> str:
        """Its adapters as `EngineSettings.lora_modules` takes them (JSON objects: a path may hold spaces)."""
        return json.dumps([{"name": name, "path": path} for name, path in self.adapters]) if self.adapters else ""


def served_models(
    references: list[str], adapters: Mapping[str, str], bases: Mapping[str, str], served_model_name: str = ""
) -> tuple[ServedModel, ...]:
    """Each declared base model with its names and its adapters.

    Args:
        references: The declared models (`model_references`).
        adapters: Every LoRA adapter, name -> path.
        bases: The base model an adapter's entry names (vLLM's `base_model_name`), by adapter name.
        served_model_name: The first model's name in result lines (empty: its reference as declared).

    Raises:
        EngineConfigError: A model declared twice, a name two models (or a model and an adapter) share, or an
            adapter whose `base_model_name` is no declared model.
    """
    if len(set(references)) < len(references):
        raise EngineConfigError(f"model declares {_listed(r for r in references if references.count(r) > 1)} twice")
    models = [
        _named(reference, served_model_name if position == 0 else "") for position, reference in enumerate(references)
    ]
    owners: dict[str, list[tuple[str, str]]] = {model.reference: [] for model in models}
    for name, path in adapters.items():
        owners[_base_of(name, path, bases.get(name, ""), models).reference].append((name, path))
    served = tuple(
        ServedModel(model.reference, model.name, model.aliases, tuple(owners[model.reference])) for model in models
    )
    _check_names_unique(served)
    return served


def _named(reference: str, served_model_name: str) -> ServedModel:
    short = model_display_name(reference or None)
    name = served_model_name or reference or short
    return ServedModel(
        reference, name, tuple(dict.fromkeys(alias for alias in (reference, short) if alias and alias != name))
    )


def _base_of(adapter: str, path: str, declared: str, models: list[ServedModel]) -> ServedModel:
    """The model an adapter runs on: the one its entry names, else the one it was trained on, else the first."""
    if len(models) == 1:
        return models[0]
    if declared:
        for model in models:
            if declared in model.names or _same_path(declared, model.reference):
                return model
        raise EngineConfigError(
            f"LoRA adapter {adapter!r} names base_model_name {declared!r}, which is none of the declared models "
            f"({_listed(model.name for model in models)})"
        )
    trained_on = _trained_on(path)
    for model in models:
        if trained_on and (trained_on in model.names or _same_path(trained_on, model.reference)):
            return model
    return models[0]


def _trained_on(path: str) -> str:
    """The base model an adapter folder's `adapter_config.json` names; empty where it cannot be read here."""
    try:
        config = json.loads((Path(path).expanduser() / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not on this machine (a replica's disk): the first model, unless named
        return ""
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    return base if isinstance(base, str) else ""


def _same_path(first: str, second: str) -> bool:
    if not first or not second:
        return False
    one, other = Path(first).expanduser(), Path(second).expanduser()
    return one.exists() and other.exists() and one.resolve() == other.resolve()


def _check_names_unique(models: tuple[ServedModel, ...]) -> None:
    owner: dict[str, str] = {}
    for model in models:
        for name in (*model.names, *model.adapter_names):
            if owner.setdefault(name, model.reference) != model.reference:
                raise EngineConfigError(
                    f"two declared models answer to {name!r} ({owner[name]!r} and {model.reference!r}): "
                    "give each model a path or hub id of its own, and each adapter a name of its own"
                )


def _listed(names: Iterable[str]) -> str:
    return ", ".join(map(repr, dict.fromkeys(names)))
