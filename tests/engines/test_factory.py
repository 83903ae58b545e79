"""create_engine: engine selection, install hints and early errors for bad model references."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flyteplugins_batcher.engines import GenerationConfig, create_engine
from flyteplugins_batcher.engines._factory import ENGINE_NAMES, vllm_usable

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the cpu extra")


def _hide_modules(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make `names` look uninstalled: `find_spec` returns None for them and importing them fails."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec | None:
        return None if name.split(".")[0] in names else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture
def vllm_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Real vLLM (the CPU build here), with torch reporting a CUDA device.

    Faked: only CUDA's presence, which `"auto"` looks at to choose vLLM; nothing is loaded.
    """
    pytest.importorskip("vllm", reason="needs vLLM (make install adds its CPU build)")
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    yield


def test_unknown_engine_lists_the_valid_names() -> None:
    with pytest.raises(
        ValueError,
        match="unknown engine 'tensorrt'; choose one of 'auto', 'transformers', 'vllm', 'simulated', 'openai'",
    ):
        create_engine("tensorrt")  # type: ignore[arg-type]
    assert ENGINE_NAMES == ("auto", "transformers", "vllm", "simulated", "openai")


def test_vllm_without_vllm_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_modules(monkeypatch, "vllm")

    with pytest.raises(ImportError, match=r"pip install 'flyteplugins-batcher\[vllm\]'"):
        create_engine("vllm", "org/model")


def test_transformers_without_the_cpu_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_modules(monkeypatch, "torch", "transformers")

    with pytest.raises(ImportError, match=r"pip install 'flyteplugins-batcher\[cpu\]'"):
        create_engine("transformers")


@needs_transformers
def test_auto_without_a_gpu_is_transformers_with_the_bundled_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from flyteplugins_batcher.engines.transformers import TransformersEngine

    _hide_modules(monkeypatch, "vllm")
    generation = GenerationConfig(max_new_tokens=7)

    engine = create_engine(generation=generation, system_prompt="Be brief.", device="cpu")

    assert isinstance(engine, TransformersEngine)
    assert engine.model_source is None  # the bundled SmolLM2
    assert engine.generation is generation
    assert engine.system_prompt == "Be brief."
    assert not engine.is_loaded  # building an engine never loads it


@needs_transformers
def test_auto_with_vllm_and_a_gpu_is_vllm(vllm_on_a_gpu: None) -> None:
    from flyteplugins_batcher.engines.vllm import VLLMStreamEngine

    engine = create_engine(model="org/model", mode="stream", max_model_len=256)

    assert isinstance(engine, VLLMStreamEngine)
    assert engine.model == "org/model"
    assert engine.mode == "stream"
    assert engine.engine_args == {"max_model_len": 256}


@needs_transformers
def test_vllm_usable_needs_both_vllm_and_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not vllm_usable()
    _hide_modules(monkeypatch, "vllm")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not vllm_usable()


@pytest.mark.slow
@needs_transformers
def test_vllm_without_a_model_serves_the_converted_bundled_checkpoint(vllm_on_a_gpu: None) -> None:
    from flyteplugins_batcher.engines import bundled_smollm2_path

    engine = create_engine("vllm")

    assert Path(engine.model) == bundled_smollm2_path()  # type: ignore[attr-defined]
    assert (Path(engine.model) / "config.json").is_file()  # type: ignore[attr-defined]
    assert engine.model_name == "SmolLM2-135M-Instruct"


@needs_transformers
@pytest.mark.parametrize("engine_name", ["transformers", "auto"])
def test_missing_model_path_fails_at_construction(engine_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_modules(monkeypatch, "vllm")

    with pytest.raises(FileNotFoundError, match=re.escape("model path './no-such-model' does not exist")):
        create_engine(engine_name, "./no-such-model")  # type: ignore[arg-type]


@needs_transformers
def test_missing_model_path_fails_for_vllm_too(vllm_on_a_gpu: None) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        create_engine("vllm", "/models/missing")


@needs_transformers
def test_malformed_model_name_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="neither an existing path nor a Hugging Face hub id"):
        create_engine("transformers", "not a model id")


@needs_transformers
def test_uncached_hub_model_offline_fails_at_load_with_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    engine = create_engine("transformers", "flyteplugins-batcher-tests/no-such-model", device="cpu")

    with pytest.raises(OSError, match="HF_HUB_OFFLINE is set") as raised:
        engine.load()
    assert "flyteplugins-batcher-tests/no-such-model" in str(raised.value)
    assert not engine.is_loaded


@needs_transformers
def test_every_engine_takes_the_keywords_engine_writes_once_and_passes_them_on():
    import inspect

    from flyteplugins_batcher.engines.simulated import SimulatedEngine
    from flyteplugins_batcher.engines.transformers import TransformersEngine
    from flyteplugins_batcher.engines.vllm import VLLMStreamEngine
    from flyteplugins_batcher.engines.vllm._engine import VLLMSupport

    shared = ["generation", "system_prompt", "chat_template", "model_name", "lora_modules"]
    for engine in (SimulatedEngine, TransformersEngine, VLLMSupport):
        assert [name for name in inspect.signature(engine).parameters if name in shared] == shared, engine
    vllm = VLLMStreamEngine("m", system_prompt="Be brief.", model_name="served", max_model_len=64)
    assert (vllm.system_prompt, vllm.model_name, vllm.engine_args) == ("Be brief.", "served", {"max_model_len": 64})
    with pytest.raises(TypeError, match="max_model_len"):
        SimulatedEngine(max_model_len=64)
