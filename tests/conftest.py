"""Shared pytest configuration."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

# workflows/ and benchmarks/ are plain folders, importable from the repository root.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


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
