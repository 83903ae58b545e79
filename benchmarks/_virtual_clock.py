"""A virtual clock for simulated devices: asyncio's timers and `time.monotonic` jump instead of waiting.

A benchmark of batching policies under load needs many minutes of traffic per contender and load;
in real time on a shared 2-core machine that takes hours, and every pause of the machine shows up
in the tail latencies. On this clock, time moves only when nothing is ready to run: the event loop
jumps to its next timer at once. A simulated device that `await asyncio.sleep(batch_time)`s and
Poisson arrivals that sleep until their time then take exactly their simulated times, and a run
takes as long as the batchers' own code does.

What the clock cannot show is that code's cost: CPU time does not move it (`bench_batcher.py`
measures the batchers' per-record overhead in real time). Batchers must be `async`: a worker thread
would sleep in real time.

`install()` replaces `time.monotonic` and `time.perf_counter` for the whole process, so it must run
before the batchers are imported (they keep a reference to it), and nothing else in that process
may need real time.

Example:
    ```python
    clock = install()
    import flyteplugins_batcher  # now reads the virtual clock

    clock.run(main())  # on an event loop whose selector jumps
    ```
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

ResultT = TypeVar("ResultT")


class VirtualClock:
    """Seconds that move only when the event loop has nothing to do but wait."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        """The virtual time (what `time.monotonic` returns once installed)."""
        return self.now

    def run(self, main: Coroutine[Any, Any, ResultT]) -> ResultT:
        """Run `main` to completion on a fresh event loop whose waits jump the clock."""
        loop = asyncio.SelectorEventLoop(_JumpingSelector(self))
        try:
            return loop.run_until_complete(main)
        finally:
            loop.close()


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that, with nothing ready, moves the clock by the timeout instead of blocking."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events:
            return events
        if timeout is None:
            raise RuntimeError("virtual clock: nothing is scheduled and nothing can happen (a hang)")
        self._clock.now += max(timeout, 0.0)
        return events


def install() -> VirtualClock:
    """Make `time.monotonic` (and so asyncio's clock) and `time.perf_counter` virtual for this process.

    `perf_counter` too, so that code timing its own work (the SLO controller spaces its decisions by
    their cost) behaves the same on every run and every machine. Returns the clock.
    """
    clock = VirtualClock()
    time.monotonic = clock.monotonic
    time.perf_counter = clock.monotonic
    return clock
