"""A run's progress on the terminal: done/total, failed, rate, output tokens/s and ETA, on one line.

- On a terminal (stdout is a TTY, as in `flyte run --local`), one line is rewritten in place as
  records finish (at most every `TERMINAL_REFRESH_S`), and left showing the final counts.
- Elsewhere (a cluster's logs, a pipe, CI), a full line is printed at most every
  `BATCH_PROGRESS_INTERVAL_S` seconds (60 by default; 0 prints one per update), so that logs get
  a heartbeat rather than a stream. The summary line says the rest.

Who calls `show` and how often is the caller's (`jobs/_report.py`'s `Progress`: once a second, and
as each chunk finishes). The rates are the caller's when it measured them (records finished per second
that records were in flight, from the replicas in this process: `LLMReplica.live_records`); otherwise they
count from the first update with a finished record on, so that model loading does not drag them down.
The ETA is shown once the total and a rate are known (a streamed input's total is known when it has
been read through).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

INTERVAL_ENV = "BATCH_PROGRESS_INTERVAL_S"
DEFAULT_LOG_INTERVAL_S = 60.0
TERMINAL_REFRESH_S = 0.5


@dataclass(frozen=True)
class ProgressState:
    """How far a run is.

    Attributes:
        done: Requests finished (answered or failed).
        failed: Requests that failed.
        total: Requests in the run, or read so far while `total_known` is False.
        total_known: Whether the whole input has been read.
        rate: Requests finished per second (0.0 while not measured yet).
        tokens_per_s: Output tokens generated per second (0.0 while not measured yet).
    """

    done: int
    failed: int
    total: int
    total_known: bool
    rate: float
    tokens_per_s: float = 0.0

    def eta_s(self) -> float | None:
        """Seconds left at the current rate, when the total and a rate are known."""
        if not self.total_known or self.rate <= 0:
            return None
        return max(self.total - self.done, 0) / self.rate

    def text(self, noun: str) -> str:
        """The line: `progress: 120/1000 requests (12%), 2 failed | 3.40 requests/s, 210 output tokens/s | ETA 4m`."""
        if self.total_known:
            share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
            count = f"{self.done}/{self.total} {noun}{share}"
        else:
            count = f"{self.done} {noun} done of {self.total} read so far"
        rate = f"{self.rate:.2f} {noun}/s" if self.rate > 0 else f"{noun}/s: measuring"
        if self.tokens_per_s > 0:
            rate += f", {self.tokens_per_s:.1f} output tokens/s"
        eta = self.eta_s()
        left = f"ETA {format_duration(eta)}" if eta is not None else "ETA: not known yet"
        if self.total_known and self.done >= self.total:
            left = "done"
        return f"progress: {count}, {self.failed} failed | {rate} | {left}"


class ProgressLine:
    """The progress line on stdout: rewritten in place on a terminal, a heartbeat line elsewhere.

    Args:
        noun: What the run counts ("requests", "questions").
        stream: Where to write (stdout).
        interval_s: Least seconds between two lines when `stream` is not a terminal (default:
            `BATCH_PROGRESS_INTERVAL_S`, else 60).
        clock: Seconds, monotonic.

    Example:
        ```python
        line = ProgressLine("requests")
        line.show(done=32, failed=1, total=1000, tokens=4096)
        line.close(done=1000, failed=3, total=1000)
        ```
    """

    def __init__(
        self,
        noun: str = "requests",
        stream: TextIO | None = None,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.noun = noun
        self._stream = stream if stream is not None else sys.stdout
        self.on_terminal = bool(getattr(self._stream, "isatty", lambda: False)())
        self._interval_s = TERMINAL_REFRESH_S if self.on_terminal else _interval(interval_s)
        self._clock = clock
        self._first: tuple[float, int, int] | None = None  # (time, done, tokens) at the first update with a record
        self._last_shown = -math.inf
        self._last_counts: tuple[int, int, int, bool] | None = None  # what the last line said was done, of what

    @property
    def interval_s(self) -> float:
        """Least seconds between two lines."""
        return self._interval_s

    def state(
        self,
        done: int,
        failed: int,
        total: int,
        total_known: bool = True,
        *,
        tokens: int = 0,
        rates: tuple[float, float] | None = None,
    ) -> ProgressState:
        """The run's state now.

        Args:
            done: Requests finished.
            failed: Of those, the failed ones.
            total: Requests in the run (or read so far).
            total_known: Whether `total` is final.
            tokens: Output tokens generated so far.
            rates: (requests/s, output tokens/s) as the caller measured them; without them, both count from
                the first update with a finished request on.
        """
        now = self._clock()
        if self._first is None and done:
            self._first = (now, done, tokens)
        if rates is not None:
            return ProgressState(done, failed, total, total_known, *rates)
        rate = tokens_per_s = 0.0
        if self._first is not None and now > self._first[0] and done > self._first[1]:
            elapsed = now - self._first[0]
            rate, tokens_per_s = (done - self._first[1]) / elapsed, (tokens - self._first[2]) / elapsed
        return ProgressState(done, failed, total, total_known, rate, max(tokens_per_s, 0.0))

    def show(self, state: ProgressState) -> None:
        """Show the state, unless the last line is more recent than the interval."""
        now = self._clock()
        counts = (state.done, state.failed, state.total, state.total_known)
        if now - self._last_shown < self._interval_s or (not self._interval_s and counts == self._last_counts):
            return  # with no interval, a line per change: a record counted live, then by its chunk, is one line
        self._last_shown, self._last_counts = now, counts
        self._write(state.text(self.noun))

    def close(self, state: ProgressState) -> None:
        """End the line: on a terminal, show the final counts and move to the next line."""
        if self.on_terminal:
            self._write(state.text(self.noun))
            self._stream.write("\n")
            self._stream.flush()

    def _write(self, text: str) -> None:
        if self.on_terminal:
            self._stream.write(f"\r{text}\x1b[K")  # over the previous line, and clear what it left
        else:
            self._stream.write(f"{text}\n")
        self._stream.flush()


def format_duration(seconds: float) -> str:
    """`42s`, `4m 18s`, `2h 05m`."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def _interval(given: float | None) -> float:
    if given is not None:
        return given
    text = os.environ.get(INTERVAL_ENV, "")
    try:
        return float(text) if text else DEFAULT_LOG_INTERVAL_S
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV} must be a number of seconds, got {text!r}") from None
