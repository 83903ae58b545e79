"""Helpers for `map`/`run`: iterate sync or async inputs, and turn a future into a yielded outcome."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any


async def aiter_records(records: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    """Iterate a sync or an async iterable alike."""
    if isinstance(records, AsyncIterable):
        async for record in records:
            yield record
    else:
        for record in records:
            yield record


async def outcome(future: asyncio.Future[Any], return_exceptions: bool) -> Any:
    """The future's result; with `return_exceptions`, its exception instead of raising it.

    As with `asyncio.gather(..., return_exceptions=True)`, a cancelled record yields its
    `CancelledError` rather than cancelling the consumer.
    """
    if not return_exceptions:
        return await future
    try:
        return await future
    except asyncio.CancelledError as exc:
        if future.cancelled():
            return exc
        raise
    except Exception as exc:
        return exc
