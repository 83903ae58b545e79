"""Fixtures for running the workflow through flyte's real local runner."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import flyte
import pytest

from workflows import batch_llm


@pytest.fixture(scope="session")
def run_locally() -> Callable[..., Any]:
    """Run a task with flyte's local runner (not a direct call) and return its output."""
    flyte.init()

    def run(task: Any, **inputs: Any) -> Any:
        execution = flyte.with_runcontext(mode="local").run(task, **inputs)
        return execution.outputs()[0]

    return run


@pytest.fixture(autouse=True)
def fresh_shared_engine(monkeypatch: pytest.MonkeyPatch):
    """Each test gets its own replica singleton, as a fresh replica would."""
    shared = batch_llm.SharedBatcher(batch_llm.load_engine, batch_llm.make_batcher, name="batch_llm")
    monkeypatch.setattr(batch_llm, "LLM", shared)
    yield shared
    close_on_its_loop(batch_llm.LLM)  # whichever singleton the test ended with


def close_on_its_loop(shared: batch_llm.SharedBatcher) -> None:
    """Stop a replica singleton on the event loop its batcher runs on (flyte's runner thread)."""
    batcher = shared.batcher
    loop = batcher.loop if batcher is not None else None
    if loop is not None and loop.is_running():
        asyncio.run_coroutine_threadsafe(shared.aclose(), loop).result(timeout=60)
