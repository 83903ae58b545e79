"""Runs the server's batches from `validating` to their end, and picks every unfinished one up after a restart.

Each batch runs as one task on the server's event loop: it checks the input file, answers the
lines (`BatchLines`), and finishes by writing the output and error files and committing them with
the batch's final status in one transaction. Everything it knows is in the store, so a server
killed at any point resumes each batch where its records end: `validating` checks again,
`in_progress` answers the lines that have no output yet, `finalizing` writes the files again, and
`cancelling` becomes `cancelled`.

With several servers on one database, each runs the batches it holds a lease on (`Store.claim`;
`LeaseKeeper` renews them and takes over those whose lease lapsed). Every status move is a
read-modify-write in one transaction (`Store.change_batch`), fenced like the recording of lines:
a server that has lost a batch's lease gets `LeaseLost` instead of writing, and its task for that
batch stops quietly, for the server that holds it now to finish it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from flyteplugins_batcher.jobs import UnrecoverableRunError
from flyteplugins_batcher.server._execution.batch_lines import scan_input, seconds_left, unanswered_records
from flyteplugins_batcher.server._execution.executors import batch_executor
from flyteplugins_batcher.server._execution.flyte_executor import RunFailedError
from flyteplugins_batcher.server._inference import Inference
from flyteplugins_batcher.server._settings import ServerSettings
from flyteplugins_batcher.server._state.batches import moved, validation_errors
from flyteplugins_batcher.server._state.errors import NotFound, Refused, StateError
from flyteplugins_batcher.server._state.files import FileStore, shown
from flyteplugins_batcher.server._state.statuses import BATCH_TRANSITIONS
from flyteplugins_batcher.server._state.store import LeaseLost, Store

logger = logging.getLogger("flyteplugins_batcher.server")

_UNANSWERED = {
    "cancelled": ("batch_cancelled", "The batch was cancelled before this request was answered."),
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
    "failed": ("batch_failed", "The batch failed before this request ran (see the batch's errors)."),
    "completed": ("inference_failed", "The request got no answer."),
}
"""What a line that has no output when its batch ends gets in the error file, by how the batch ended."""


class BatchRunner:
    """The server's batches in motion.

    Args:
        store: The batches and their answered lines.
        files: The input and output files.
        inference: What answers the lines.
        settings: Chunk sizes and the engine's generation defaults.
    """

    def __init__(self, store: Store, files: FileStore, inference: Inference, settings: ServerSettings) -> None:
        self.store = store
        self.files = files
        self.inference = inference
        self.settings = settings
        self.executor = batch_executor(settings, store, files, inference)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancelled: dict[str, asyncio.Event] = {}  # set once a batch is cancelled: its lines in flight stop

    def resume(self, *, take_over: bool = False) -> int:
        """Start every unfinished batch this server can claim (nobody holds it, or its lease lapsed); returns how many.

        Args:
            take_over: Claim every unfinished batch, whoever held it: for the embedded database,
                whose only server is this one, started again (its previous run's leases are its own).
        """
        claimed = self.store.claim_lapsed(force=take_over)
        for batch_id in claimed:
            logger.info("resuming batch %s", batch_id)
            self.start(batch_id)
        return len(claimed)

    def keep(self, owned: dict[str, str], lost: Sequence[str] = ()) -> None:
        """Act on what the store says this server holds (`LeaseKeeper` calls it after renewing the leases).

        Args:
            owned: The unfinished batches this server holds, with their statuses: each one runs, and one
                that another server moved to `cancelling` has its lines stopped.
            lost: Batches another server took over: their tasks here stop.
        """
        for batch_id in lost:
            task = self._tasks.get(batch_id)
            if task is not None and not task.done():
                logger.warning("batch %s: another server has taken it over; this one stops running it", batch_id)
                task.cancel()
        for batch_id, status in owned.items():
            if status == "cancelling":
                self._cancel_event(batch_id).set()
            self.start(batch_id)

    def running(self) -> set[str]:
        """The batches this server has a task for now."""
        return set(self._tasks)

    def start(self, batch_id: str) -> None:
        """Run a batch in the background (once: a batch already running is left alone)."""
        if batch_id not in self._tasks:
            task = asyncio.create_task(self._drive(batch_id), name=f"batch-{batch_id}")
            self._tasks[batch_id] = task
            task.add_done_callback(lambda _: self._tasks.pop(batch_id, None))

    def cancel(self, batch_id: str) -> dict[str, Any]:
        """Cancel a batch: no new line starts, lines in flight stop; answered lines stay in the output. Idempotent.

        Any server takes a cancel: it moves the batch to `cancelling` in the store. The server that
        runs the batch stops its lines (at once when it is this one; else when its `LeaseKeeper`
        next looks, within a third of `lease_s`); a batch nobody holds is claimed and finished here.

        Raises:
            NotFound: No such batch.
            Refused: The batch has already ended otherwise.
        """
        batch = self.store.change_batch(batch_id, _cancelling, fenced=False)
        if batch is None:
            raise NotFound(f"No such batch{shown(batch_id)}", code="batch_not_found", param="batch_id")
        if batch["status"] == "cancelling" and self.store.claim(batch_id):
            self._cancel_event(batch_id).set()
            self.start(batch_id)  # finishes it at once when nothing runs it; else its task stops its lines
        return batch

    def get(self, batch_id: str) -> dict[str, Any]:
        """A batch's object.

        Raises:
            NotFound: There is no such batch.
        """
        batch = self.store.batch(batch_id)
        if batch is None:
            raise NotFound(f"No such batch{shown(batch_id)}", code="batch_not_found", param="batch_id")
        return batch

    async def aclose(self) -> None:
        """Stop the batches' tasks; their state stays in the store, and the next start resumes them."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait(self, batch_id: str) -> None:
        """Until a batch's task ends (for tests and benchmarks)."""
        task = self._tasks.get(batch_id)
        if task is not None:
            await asyncio.shield(task)

    # -- one batch ---------------------------------------------------------------------------------

    async def _drive(self, batch_id: str) -> None:
        try:
            await self._steps(batch_id)
        except LeaseLost:
            logger.info("batch %s: another server runs it now; this one stops", batch_id)
        finally:
            self._cancelled.pop(batch_id, None)

    async def _steps(self, batch_id: str) -> None:
        try:
            batch = self.get(batch_id)
            if batch["status"] == "validating":
                batch = await self._validate(batch)
            if batch["status"] == "in_progress":
                batch = await self._answer(batch)
            if batch["status"] in ("in_progress", "finalizing", "cancelling"):
                await self._finish(batch)
        except (asyncio.CancelledError, LeaseLost):
            raise
        except StateError as error:  # said for a client: its message names no path and no exception
            logger.warning("batch %s failed: %s", batch_id, error.message)
            await self._fail(batch_id, error.code or "server_error", error.message)
        except Exception:
            # The traceback goes to the log; the batch's errors, which its client reads, say only where to look.
            incident = secrets.token_hex(6)
            logger.exception("batch %s failed (error id %s)", batch_id, incident)
            message = f"The server failed while running this batch (error id {incident}; its log has it)."
            await self._fail(batch_id, "server_error", message)

    async def _validate(self, batch: dict[str, Any]) -> dict[str, Any]:
        # gone: the batch fails, saying so; another replica's upload comes from the object store first
        path = await asyncio.to_thread(self.files.content, batch["input_file_id"], param="input_file_id")
        total, errors = await asyncio.to_thread(scan_input, path, batch["endpoint"])

        def validated(current: dict[str, Any]) -> dict[str, Any] | None:
            if current["status"] != "validating":  # cancelled meanwhile
                return None
            if errors:
                return moved(current, "failed", errors=validation_errors(errors))
            return moved(current, "in_progress", request_counts={"total": total, "completed": 0, "failed": 0})

        return await self._change(batch["id"], validated)

    async def _answer(self, batch: dict[str, Any]) -> dict[str, Any]:
        try:
            await self.executor.answer(batch, cancelled=self._cancel_event(batch["id"]))
        except RunFailedError as error:  # its message names the run, for the batch's client
            await self._fail(batch["id"], "run_failed", str(error))
        except UnrecoverableRunError:
            incident = secrets.token_hex(6)
            logger.exception("batch %s: the engine cannot run it (error id %s)", batch["id"], incident)
            message = f"The model could not be started to run this batch (error id {incident}; its log has it)."
            await self._fail(batch["id"], "engine_failed", message)
        return self.get(batch["id"])

    async def _finish(self, batch: dict[str, Any]) -> None:
        """End a batch whose lines ran (or stopped): completed, or cancelled, or expired.

        A batch whose every line has its output is completed, whatever the clock says now: its
        window may have closed between its last line's answer and this moment, and `expired` is
        for a batch that left lines unanswered.
        """
        if batch["status"] == "in_progress" and (seconds_left(batch) > 0 or _all_answered(batch)):
            batch = await self._change(batch["id"], _finalizing)  # unless it was cancelled meanwhile
        if batch["status"] == "cancelling":
            final = "cancelled"
        elif batch["status"] == "in_progress":  # its window closed with lines unanswered
            final = "expired"
        else:
            final = "completed"
        await self._end(batch, final)

    async def _end(self, batch: dict[str, Any], final: str, **fields: Any) -> None:
        """Give every line without output its error line, write the files, commit them with the final status."""
        unanswered = await asyncio.to_thread(self._fail_unanswered, batch, *_UNANSWERED[final])
        if unanswered and final == "completed":
            logger.warning("batch %s: %d lines got no answer; they are in the error file", batch["id"], unanswered)
        output, errors = await asyncio.to_thread(self._write_files, batch["id"])

        def ended(current: dict[str, Any]) -> dict[str, Any]:
            status = "cancelled" if current["status"] == "cancelling" else final  # a cancel came meanwhile
            changes = {**(fields if status == final else {}), "output_file_id": output["id"]}
            counts = current["request_counts"]
            if not counts.get("total"):  # cancelled before validation counted its lines: each one is in a file now
                changes["request_counts"] = {**counts, "total": counts["completed"] + counts["failed"]}
            return moved(current, status, error_file_id=errors["id"], **changes)

        batch = await self._change(batch["id"], ended, files=[output, errors])
        logger.info("batch %s %s: %s", batch["id"], batch["status"], batch["request_counts"])

    def _fail_unanswered(self, batch: dict[str, Any], code: str, message: str) -> int:
        path = self.files.local_path(batch["input_file_id"])  # a replica that took the batch over fetches it
        if path is None:  # its input is gone (the reason it failed): the lines it has are what it answered
            return 0
        answered = self.store.answered_lines(batch["id"])
        records = unanswered_records(path, answered, code, message)
        if records:
            self.store.record_lines(batch["id"], records)
        return len(records)

    def _write_files(self, batch_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        output = self.files.write_output(self.store.outputs(batch_id, ok=True), filename=f"{batch_id}_output.jsonl")
        errors = self.files.write_output(self.store.outputs(batch_id, ok=False), filename=f"{batch_id}_error.jsonl")
        return output, errors

    async def _fail(self, batch_id: str, code: str, message: str) -> None:
        """A batch that cannot go on: `failed`, with the reason in its errors, and the lines it answered kept."""
        batch = await asyncio.to_thread(self.store.batch, batch_id)
        if batch is None or "failed" not in BATCH_TRANSITIONS.get(batch["status"], ()):
            return
        errors = validation_errors([{"code": code, "message": message, "param": None, "line": None}])
        if batch["status"] == "validating":
            await self._change(batch_id, lambda current: _failed(current, errors))
        else:
            await self._end(batch, "failed", errors=errors)

    async def _change(
        self, batch_id: str, change: Callable[[dict[str, Any]], dict[str, Any] | None], **options: Any
    ) -> dict[str, Any]:
        """`Store.change_batch`, fenced (this server's own moves), off the event loop; returns the batch after it.

        Raises:
            LeaseLost: Another server runs the batch now.
        """
        batch = await asyncio.to_thread(self.store.change_batch, batch_id, change, **options)
        if batch is None:
            raise NotFound(f"No such batch{shown(batch_id)}", code="batch_not_found", param="batch_id")
        return batch

    def _cancel_event(self, batch_id: str) -> asyncio.Event:
        return self._cancelled.setdefault(batch_id, asyncio.Event())


def _cancelling(batch: dict[str, Any]) -> dict[str, Any] | None:
    """A cancel request's change: to `cancelling` from `validating` or `in_progress`; none once it is cancelled.

    Raises:
        Refused: The batch has already ended otherwise (or is finalizing).
    """
    if batch["status"] in ("cancelling", "cancelled"):
        return None
    if batch["status"] not in ("validating", "in_progress"):
        raise Refused(f"Cannot cancel a batch with status {batch['status']!r}.", code="batch_not_cancellable")
    return moved(batch, "cancelling")


def _failed(batch: dict[str, Any], errors: dict[str, Any]) -> dict[str, Any] | None:
    """A batch that cannot be validated moves to `failed`; one cancelled meanwhile stays as it is."""
    return moved(batch, "failed", errors=errors) if batch["status"] == "validating" else None


def _finalizing(batch: dict[str, Any]) -> dict[str, Any] | None:
    """An `in_progress` batch whose lines ran moves to `finalizing`; one cancelled meanwhile stays as it is."""
    return moved(batch, "finalizing") if batch["status"] == "in_progress" else None


def _all_answered(batch: dict[str, Any]) -> bool:
    """Whether every line of a batch has its output (its counts as the store holds them)."""
    counts = batch["request_counts"]
    return counts["completed"] + counts["failed"] >= counts["total"]
