"""Flyte runs of the JSONL job, started and followed by the server: in this process (local) or on a cluster (remote).

Both launchers give the executor (`flyteplugins_batcher/server/_execution/flyte_executor.py`) the same three
things: start a run of the JSONL job task under a name, find a run again by its name, and, for a
run, its phase (flyte's `ActionPhase` values: `queued` ... `running`, then `succeeded`, `failed`,
`aborted`, `timed_out`), its address and a way to abort it. A run also needs places that the run
and the server can both reach: its input file, its journal and its output folder.

- `LocalRuns`: flyte's local runner, in this process (`flyte.with_runcontext(mode="local")`), as
  `flyte run --local` runs the job. Its chunks run on this process's replica, the server's own
  engine. A local run lives as long as the server: after a restart it is started again, and its
  finished chunks come from flyte's local cache.
- `RemoteRuns`: runs on the cluster the app is deployed to (`mode="remote"`), of the job task
  deployed with the app (`BatcherAppEnvironment` depends on the job's environments). Its files go
  under an object-store prefix (`ServerSettings.runs_uri`). A restarted server re-attaches to its
  runs by name.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import flyte
from flyte.io import File

from flyteplugins_batcher.server._execution.run_process import die_with_parent

logger = logging.getLogger("flyteplugins_batcher.server")

TERMINAL_PHASES = frozenset({"succeeded", "failed", "aborted", "timed_out", "recovered"})
"""The phases of a run that has ended."""

PROCESS_STOP_S = 10.0
"""Seconds an aborted run's process has to stop after SIGTERM before it is killed."""

JOB_TASK_NAME = "batch_jsonl_driver.run_batch_file"
"""The JSONL job's task as deployed (`flyteplugins_batcher.jobs.run_batch_file`)."""


class RunHandle(Protocol):
    """A run of the JSONL job, as the executor follows it."""

    name: str
    url: str

    async def phase(self) -> str:
        """The run's phase now (`running`, `succeeded`, ...)."""
        ...

    async def abort(self) -> None:
        """Stop the run; lines it finished stay in its journal."""
        ...

    def failure(self) -> str:
        """Why a failed run failed, in a line (empty when it did not fail, or nothing is known)."""
        ...


class RunLauncher(Protocol):
    """Starts runs of the JSONL job and finds them again."""

    async def start(self, name: str, inputs: dict[str, Any]) -> RunHandle:
        """Start a run of the job under `name` with `inputs` (the job's keyword arguments)."""
        ...

    async def attach(self, name: str) -> RunHandle | None:
        """The run called `name`, when it can still be followed (`None`: start it again)."""
        ...

    async def input_file(self, path: Path, batch_id: str) -> File:
        """The batch's input file where the run can read it."""
        ...

    def folder(self, batch_id: str, run_name: str) -> str:
        """Where a run of a batch keeps its journal (`/journal`) and outputs (`/out`): a folder or a URI prefix."""
        ...

    def discard(self, batch_id: str) -> None:
        """Remove what a batch's runs left, once the batch holds every line they answered."""
        ...

    @property
    def runs_are_ours(self) -> bool:
        """Whether runs live and die with this server (local), so that one that lost its batch must be stopped."""
        ...


@dataclass
class LocalRun:
    """A run of flyte's local runner, as an asyncio task of this process."""

    name: str
    url: str
    task: asyncio.Task[Any]

    async def phase(self) -> str:
        if not self.task.done():
            return "running"
        if self.task.cancelled():
            return "aborted"
        return "failed" if self.task.exception() is not None else "succeeded"

    async def abort(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    def failure(self) -> str:
        if not self.task.done() or self.task.cancelled() or self.task.exception() is None:
            return ""
        return _first_line(self.task.exception())


class LocalRuns:
    """Runs in this process, with flyte's local runner; their files under `folder`.

    Args:
        folder: Where runs keep their journals, outputs and flyte's local metadata.

    Example:
        ```python
        runs = LocalRuns(data_dir / "runs")
        run = await runs.start("batch-abc-1", inputs)
        ```
    """

    def __init__(self, folder: Path) -> None:
        self.root = folder
        self._runs: dict[str, RunHandle] = {}

    async def start(self, name: str, inputs: dict[str, Any]) -> RunHandle:
        from flyteplugins_batcher.jobs import run_batch_file as job

        flyte.init()  # local: no cluster, no config file
        metadata = self.root / ".flyte"
        context = flyte.with_runcontext(mode="local", name=name, run_base_dir=str(metadata))
        task = asyncio.create_task(context.run.aio(job, **inputs), name=f"run-{name}")
        run = LocalRun(name, "", task)  # no address: a local run has no UI, and its folder is not for clients
        self._runs[name] = run
        task.add_done_callback(lambda _: logger.info("run %s ended: %s", name, run.failure() or "done"))
        return run

    async def attach(self, name: str) -> RunHandle | None:
        return self._runs.get(name)

    @property
    def runs_are_ours(self) -> bool:
        return True

    async def input_file(self, path: Path, batch_id: str) -> File:
        return File(path=str(path.resolve()))

    def folder(self, batch_id: str, run_name: str) -> str:
        return str((self.root / batch_id / run_name).resolve())

    def discard(self, batch_id: str) -> None:
        """Remove the batch's run folders and flyte's local metadata of its runs: the batch's files hold their lines."""
        shutil.rmtree(self.root / batch_id, ignore_errors=True)
        for metadata in (self.root / ".flyte").glob(f"{run_prefix(batch_id)}*"):
            shutil.rmtree(metadata, ignore_errors=True)
        for name in [name for name in self._runs if name.startswith(run_prefix(batch_id))]:
            del self._runs[name]  # a server that runs batches for months keeps none of their runs


@dataclass
class ProcessRun:
    """A local run in a process of its own (`flyteplugins_batcher/server/_execution/run_process.py`)."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    aborted: bool = False

    async def phase(self) -> str:
        code = self.process.poll()
        if code is None:
            return "running"
        if self.aborted:
            return "aborted"
        return "succeeded" if code == 0 else "failed"

    async def abort(self) -> None:
        self.aborted = True
        self.process.terminate()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.process.wait), PROCESS_STOP_S)
        except TimeoutError:
            self.process.kill()
            await asyncio.to_thread(self.process.wait)

    def failure(self) -> str:
        lines = self.log.read_text(errors="replace").strip().splitlines() if self.log.is_file() else []
        return lines[-1][:300] if lines else ""


class ProcessRuns(LocalRuns):
    """Local runs, each a process of its own with its own replica (engine and batcher), as runs on a cluster are.

    The server's engine then answers online requests alone, at the cost of a second model in memory.
    A run dies with the server that started it; the next attempt reuses its finished chunks (flyte's
    local cache is shared by the processes of one user).
    """

    async def start(self, name: str, inputs: dict[str, Any]) -> RunHandle:
        folder = Path(self.folder(_batch_of(name), name))
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / "run.log"
        arguments = json.dumps({**inputs, "input": inputs["input"].path})
        with log.open("wb") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "flyteplugins_batcher.server._execution.run_process", arguments],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,  # only a prctl call between fork and exec
            )
        run = ProcessRun(name, "", process, log)
        self._runs[name] = run
        return run


@dataclass
class RemoteRun:
    """A run on the cluster, looked up again at each question (its phase changes there)."""

    name: str
    url: str
    _last_error: str = ""

    async def phase(self) -> str:
        from flyte.remote import Run

        run = await Run.get.aio(self.name)
        phase = str(getattr(run.phase, "value", run.phase)).lower()
        if phase == "failed":
            failure = await run.first_failure.aio()
            self._last_error = _first_line(getattr(failure, "error_message", "") or "") if failure else ""
        return phase

    async def abort(self) -> None:
        from flyte.remote import Run

        run = await Run.get.aio(self.name)
        await run.abort.aio(reason="The batch was cancelled or its completion window closed.")

    def failure(self) -> str:
        return self._last_error


class RemoteRuns:
    """Runs on the cluster the app is deployed to; their files under the object-store prefix `storage_uri`.

    Args:
        storage_uri: A prefix both the app and the runs can reach (`s3://bucket/batcher`).
        task_name: The JSONL job's task as deployed.
    """

    def __init__(self, storage_uri: str, task_name: str = JOB_TASK_NAME) -> None:
        self.storage_uri = storage_uri.rstrip("/")
        self.task_name = task_name

    async def start(self, name: str, inputs: dict[str, Any]) -> RunHandle:
        from flyte.remote import Task

        task = Task.get(self.task_name, auto_version="latest")
        run = await flyte.with_runcontext(mode="remote", name=name).run.aio(task, **inputs)
        return RemoteRun(run.name, run.url)

    async def attach(self, name: str) -> RunHandle | None:
        from flyte.remote import Run

        try:
            run = await Run.get.aio(name)
        except Exception:  # not found (never started, or purged): the executor starts it again
            logger.info("run %s cannot be found; starting it again", name)
            return None
        return RemoteRun(run.name, run.url)

    async def input_file(self, path: Path, batch_id: str) -> File:
        return await File.from_local(str(path), f"{self.storage_uri}/{batch_id}/input.jsonl")

    def folder(self, batch_id: str, run_name: str) -> str:
        return f"{self.storage_uri}/{batch_id}/{run_name}"

    def discard(self, batch_id: str) -> None:
        """Nothing: a run's inputs and outputs stay in the object store with the run (its lifecycle rules apply)."""

    @property
    def runs_are_ours(self) -> bool:
        """False: a cluster's run outlives a server; the replica that takes its batch over follows it by name."""
        return False


def _batch_of(run_name: str) -> str:
    """The batch id a run's name was made from (`batch-<hex>-<attempt>` is run `attempt` of `batch_<hex>`)."""
    return run_name.rsplit("-", 1)[0].replace("-", "_", 1)


def run_prefix(batch_id: str) -> str:
    """What the names of a batch's runs start with (Flyte's run names: lowercase letters, digits, dashes)."""
    return f"{batch_id.replace('_', '-').lower()}-"


def _first_line(error: object) -> str:
    """An error's first line, shortened: enough to say why, never a traceback."""
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else type(error).__name__
