"""What runs a batch's lines: the executor protocol, and the factory that picks one from the settings.

Two executors answer it: `in-process` (`in_process.py`: the lines run on this server's own
replicas) and `flyte` (`flyte_executor.py`: a batch is a Flyte run of the JSONL job, followed
through its journal; its runs local in the server, local in processes of their own, or remote,
`flyte_runs.py`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

from flyteplugins_batcher.server._execution.flyte_executor import FlyteExecutor
from flyteplugins_batcher.server._execution.flyte_runs import LocalRuns, ProcessRuns, RemoteRuns, RunLauncher
from flyteplugins_batcher.server._execution.in_process import InProcessExecutor
from flyteplugins_batcher.server._inference import Inference
from flyteplugins_batcher.server._settings import ServerSettings
from flyteplugins_batcher.server._state.files import FileStore
from flyteplugins_batcher.server._state.store import Store

EXECUTORS = ("in-process", "flyte")
"""The values of `ServerSettings.batch_executor`."""


LOCAL_RUNS = ("server", "process")
"""The values of `ServerSettings.local_runs`."""


class BatchExecutor(Protocol):
    """What answers a batch's lines, recording them in the store as they finish (`BatchRunner` owns its status)."""

    async def answer(self, batch: dict[str, Any], *, cancelled: asyncio.Event) -> None:
        """Answer the batch's unanswered lines until each has its output, `cancelled` is set or its window closes."""
        ...


def batch_executor(settings: ServerSettings, store: Store, files: FileStore, inference: Inference) -> BatchExecutor:
    """The executor `settings.batch_executor` names, with the run launcher `settings.runs_uri` implies.

    Raises:
        ValueError: An unknown executor.
    """
    if settings.batch_executor == "in-process":
        return InProcessExecutor(store, files, inference, settings)
    if settings.batch_executor != "flyte":
        raise ValueError(f"batch_executor must be one of {list(EXECUTORS)}, got {settings.batch_executor!r}")
    return FlyteExecutor(store, files, settings, run_launcher(settings), inference)


def run_launcher(settings: ServerSettings) -> RunLauncher:
    """Remote runs for a remote `runs_uri`; else local runs in the server (`local_runs="server"`) or in processes.

    Raises:
        ValueError: An unknown `local_runs`.
    """
    uri = settings.runs_uri.strip()
    if "://" in uri and not uri.startswith("file://"):
        return RemoteRuns(uri)
    folder = Path(uri.removeprefix("file://") or settings.data_dir / "runs")
    if settings.local_runs not in LOCAL_RUNS:
        raise ValueError(f"local_runs must be one of {list(LOCAL_RUNS)}, got {settings.local_runs!r}")
    return LocalRuns(folder) if settings.local_runs == "server" else ProcessRuns(folder)
