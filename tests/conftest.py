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
        self.gate = asyncio.Event()
        self.gate.set()
        self._result = result or (lambda record: record)

    async def __call__(self, batch: list[Any]) -> list[Any]:
        await self.gate.wait()
        self.batches.append(list(batch))
        return [self._result(record) for record in batch]
