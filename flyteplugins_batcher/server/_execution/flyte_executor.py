"""The `flyte` batch executor: a batch is a Flyte run of the JSONL job, and the batch object follows the run.

`--batch-executor flyte`. The server stays the control plane: it takes the file, checks it,
and owns the batch's status; the run is the execution plane. It is a run of the same task as
`flyteplugins-batcher run-batch` and `workflows/batch_jsonl.py` (`run_batch_file`), so its chunks
fan out to the reusable LLM and embedding replicas, queue when they are busy, and are cached by
content.

A batch's path:

1. The run is recorded on the batch (`flyte_run`: name, address, phase, attempt) before it
   starts, so that a server that dies right after starting it finds it again by name.
2. While it runs, the server reads the run's journal (`flyteplugins_batcher/jobs/_journal.py`):
   each new segment's lines are recorded with the batch's counts, as the in-process executor
   records a chunk, so `request_counts` move as the run goes and a line recorded twice (a
   restarted run's reused chunks) counts once.
3. Its phase is mirrored on `flyte_run.phase`. A cancel, or the completion window closing, aborts
   the run; what its journal holds stays, and the batch's end fails the rest as the in-process
   executor's does. A run that fails ends the batch `failed`, its answered lines kept.
4. A batch picked up after a restart (or taken over from another replica) re-attaches to its run
   by name when the launcher can (remote runs), and otherwise starts the next attempt, whose
   finished chunks come from the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

from flyteplugins_batcher import BatcherError
from flyteplugins_batcher.jobs import RunOptions, read_journal_segment
from flyteplugins_batcher.server._execution.flyte_runs import (
    TERMINAL_PHASES,
    RunHandle,
    RunLauncher,
    run_prefix,
)
from flyteplugins_batcher.server._inference import Inference
from flyteplugins_batcher.server._settings import ServerSettings
from flyteplugins_batcher.server._state.files import FileStore
from flyteplugins_batcher.server._state.store import LeaseLost, Store

logger = logging.getLogger("flyteplugins_batcher.server")

POLL_S = 1.0
"""Seconds between two looks at a run (its phase, its journal)."""

ABORT_WAIT_S = 60.0
"""Longest wait, after aborting a run, for it to reach a final phase before the batch ends anyway."""


class RunFailedError(BatcherError, RuntimeError):
    """A batch's run failed; the message is for the batch's client (it names the run, and no internals)."""


class JournalIngest:
    """Records the lines of a run's journal on its batch, a segment at a time, each segment once.

    Args:
        store: Where the batch's answered lines are recorded.
        batch_id: The batch.
        location: The run's journal (a folder or a URI prefix).
    """

    def __init__(self, store: Store, batch_id: str, location: str) -> None:
        self.store = store
        self.batch_id = batch_id
        self.location = location
        self.next_segment = 1

    async def read(self) -> int:
        """Record every segment written since the last read; returns how many lines they held."""
        lines = 0
        while (entries := await read_journal_segment(self.location, self.next_segment)) is not None:
            await asyncio.to_thread(
                self.store.record_lines, self.batch_id, entries
            )  # a journal's entries are finished lines
            lines += len(entries)
            self.next_segment += 1
        return lines


class FlyteExecutor:
    """Runs each batch as a Flyte run of the JSONL job, and follows it.

    Args:
        store: The batches and their answered lines.
        files: The input files.
        settings: Chunk sizes and engine settings, given to the run as the job's inputs.
        launcher: Starts and finds the runs (`LocalRuns` or `RemoteRuns`).
        inference: The server's models: the runs answer under its LLM's name.
        poll_s: Seconds between two looks at a run.

    Example:
        ```python
        executor = FlyteExecutor(store, files, settings, LocalRuns(data_dir / "runs"), inference)
        await executor.answer(batch, cancelled=asyncio.Event())
        ```
    """

    def __init__(
        self,
        store: Store,
        files: FileStore,
        settings: ServerSettings,
        launcher: RunLauncher,
        inference: Inference,
        *,
        poll_s: float = POLL_S,
    ) -> None:
        self.store = store
        self.files = files
        self.settings = settings
        self.launcher = launcher
        self.inference = inference
        self.poll_s = poll_s

    async def answer(self, batch: dict[str, Any], *, cancelled: asyncio.Event) -> None:
        """Run the batch's lines as a Flyte run (or follow the one it has) until it ends, is cancelled or expires.

        Raises:
            RunFailedError: The run failed (its answered lines are recorded).
        """
        run = await self._run_of(batch)
        ingest = JournalIngest(self.store, batch["id"], f"{self.launcher.folder(batch['id'], run.name)}/journal")
        try:
            phase = await self._follow(batch, run, ingest, cancelled)
            await ingest.read()  # what the run wrote last
        except LeaseLost:
            await self._let_go(run)
            raise
        self.launcher.discard(batch["id"])  # every line it answered is in the store now
        if phase in ("failed", "timed_out") and not cancelled.is_set():
            logger.warning("batch %s: run %s %s: %s", batch["id"], run.name, phase, run.failure())
            where = f" ({run.url})" if "://" in run.url else ""
            ended = phase.replace("_", " ")
            raise RunFailedError(f"The Flyte run {run.name} of this batch {ended}{where}; its logs say why.")

    async def _run_of(self, batch: dict[str, Any]) -> RunHandle:
        """The batch's run: the one it has when it can still be followed, else a new attempt."""
        recorded = batch.get("flyte_run") or {}
        if recorded.get("name"):
            run = await self.launcher.attach(recorded["name"])
            if run is not None:
                logger.info("batch %s: following its run %s again", batch["id"], run.name)
                return run
        attempt = int(recorded.get("attempt", 0)) + 1
        name = run_name(batch["id"], attempt)
        self._record_run(batch["id"], {"name": name, "url": "", "phase": "starting", "attempt": attempt})
        run = await self.launcher.start(name, await self._inputs(batch, name))
        try:
            self._record_run(batch["id"], {"name": name, "url": run.url, "phase": "queued", "attempt": attempt})
        except LeaseLost:
            await self._let_go(run)
            raise
        logger.info("batch %s: started run %s (attempt %d)", batch["id"], name, attempt)
        return run

    async def _let_go(self, run: RunHandle) -> None:
        """Another replica runs the batch now: stop a run that dies with this server, or it would repeat that work.

        A cluster's run goes on: the replica that took the batch over follows it by name.
        """
        if self.launcher.runs_are_ours:
            logger.info("run %s: its batch was taken over by another replica; stopping it", run.name)
            await run.abort()

    async def _inputs(self, batch: dict[str, Any], name: str) -> dict[str, Any]:
        """The JSONL job's inputs for a run of `batch`: its file, where to write, the server's settings.

        The job takes its option sets spread into inputs of their own (`flyteplugins_batcher/jobs/_options.py`).
        """
        folder = self.launcher.folder(batch["id"], name)
        path = await asyncio.to_thread(self.files.content, batch["input_file_id"], param="input_file_id")
        options = RunOptions(
            chunk_size=self.settings.batch_chunk_size,
            max_chunks_in_flight=self.settings.batch_chunks_in_flight,
            max_failed_fraction=1.0,  # a batch's bad lines go to its error file; the run itself succeeds
            output_dir=f"{folder}/out",
            order=self.settings.batch_order,
        )
        return {
            "input": await self.launcher.input_file(path, batch["id"]),
            "model_mismatch": "error",
            "served_model_name": self.inference.served_model,
            "journal": f"{folder}/journal",
            **dataclasses.asdict(options),
            **dataclasses.asdict(self.settings.engine),
        }

    async def _follow(
        self, batch: dict[str, Any], run: RunHandle, ingest: JournalIngest, cancelled: asyncio.Event
    ) -> str:
        """Record the run's lines and phase as it goes; abort it on cancel or expiry. Returns its last phase."""
        seen = ""
        while True:
            await ingest.read()
            phase = await run.phase()
            if phase != seen:
                self._set_phase(batch["id"], phase)
                seen = phase
            if phase in TERMINAL_PHASES:
                return phase
            if cancelled.is_set() or time.time() >= batch["expires_at"]:
                return await self._abort(batch["id"], run)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cancelled.wait(), self.poll_s)

    async def _abort(self, batch_id: str, run: RunHandle) -> str:
        logger.info("batch %s: aborting its run %s", batch_id, run.name)
        await run.abort()
        deadline = time.monotonic() + ABORT_WAIT_S
        phase = await run.phase()
        while phase not in TERMINAL_PHASES and time.monotonic() < deadline:
            await asyncio.sleep(self.poll_s)
            phase = await run.phase()
        self._set_phase(batch_id, phase)
        return phase

    def _record_run(self, batch_id: str, record: dict[str, Any]) -> None:
        self.store.change_batch(batch_id, lambda batch: {**batch, "flyte_run": record})

    def _set_phase(self, batch_id: str, phase: str) -> None:
        def change(batch: dict[str, Any]) -> dict[str, Any]:
            return {**batch, "flyte_run": {**(batch.get("flyte_run") or {}), "phase": phase}}

        self.store.change_batch(batch_id, change)


def run_name(batch_id: str, attempt: int) -> str:
    """A run's name for a batch's attempt: lowercase letters, digits and dashes, as Flyte's run names are."""
    return f"{run_prefix(batch_id)}{attempt}"
