"""A run's journal: its finished lines, written in numbered segments while it runs, for whoever follows it.

The JSONL job publishes its results and errors files only at the end. A run that is aborted
midway (a cancelled or expired batch) or whose follower stops (a server replica that dies) would
leave nothing a follower could use. With a journal location (`journal=` on the job: a local folder
or an object-store prefix both sides can reach), the job also writes every finished line there,
with its input line number, in segments `segment-000001.jsonl`, `segment-000002.jsonl`, ... at
most every `interval_s` seconds and once at the end. Each segment appears whole (renamed into place
locally; one object put remotely), so a reader never sees half of one; it reads them in order and
stops at the first that is missing, which is where it goes on next time.

The Batch API server's `flyte` executor follows its runs this way: the segments are its progress
(`request_counts` while the run goes) and the lines it keeps when the run is aborted.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import flyte.storage

from flyteplugins_batcher.replica import FinishedLine

DEFAULT_INTERVAL_S = 2.0
"""Least seconds between two segments while a run goes (the last is written at the end whatever the interval)."""


def segment_name(number: int) -> str:
    """The name of a journal's `number`th segment (1-based)."""
    return f"segment-{number:06d}.jsonl"


def _is_remote(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def _local(location: str) -> Path:
    return Path(location.removeprefix("file://"))


class JournalWriter:
    """Writes a run's finished lines to its journal in segments.

    Args:
        location: A local folder (created) or an object-store prefix (`s3://bucket/runs/batch_1`).
        interval_s: Least seconds between two segments while the run goes.
        clock: Seconds, monotonic.

    Example:
        ```python
        journal = JournalWriter("/data/runs/batch_1")
        journal.add(FinishedLine(line=3, ok=True, output=result_line))
        await journal.flush()  # a segment, if interval_s has passed since the last
        await journal.close()  # the rest
        ```
    """

    def __init__(
        self, location: str, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.location = location.rstrip("/")
        self.interval_s = interval_s
        self.segments = 0
        self._clock = clock
        self._pending: list[str] = []
        self._last = clock()
        if not _is_remote(self.location):
            _local(self.location).mkdir(parents=True, exist_ok=True)

    def add(self, entry: FinishedLine) -> None:
        """Keep a finished line for the next segment."""
        self._pending.append(entry.to_json())

    async def flush(self, *, force: bool = False) -> None:
        """Write the lines kept so far as the next segment, if `interval_s` has passed (or `force`)."""
        if not self._pending or (not force and self._clock() - self._last < self.interval_s):
            return
        data = ("\n".join(self._pending) + "\n").encode()
        name = segment_name(self.segments + 1)
        if _is_remote(self.location):
            await flyte.storage.put_stream(data, to_path=f"{self.location}/{name}")
        else:
            _write_whole(_local(self.location) / name, data)
        self.segments += 1
        self._pending.clear()
        self._last = self._clock()

    async def close(self) -> None:
        """Write what is left."""
        await self.flush(force=True)


def _write_whole(target: Path, data: bytes) -> None:
    """Write `data` to `target` so that a reader sees all of it or nothing (a rename is atomic)."""
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=".segment-")
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


async def read_journal_segment(location: str, number: int) -> list[FinishedLine] | None:
    """The lines of a journal's `number`th segment, or `None` while it does not exist."""
    path = f"{location.rstrip('/')}/{segment_name(number)}"
    if _is_remote(location):
        if not await flyte.storage.exists(path):
            return None
        data = b"".join([chunk async for chunk in flyte.storage.get_stream(path)])
    else:
        try:
            data = _local(path).read_bytes()
        except FileNotFoundError:
            return None
    return [FinishedLine.from_json(text) for text in data.decode().splitlines() if text.strip()]
