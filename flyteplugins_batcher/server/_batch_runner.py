"""Runs the server's batches from `validating` to their end, and picks every unfinished one up after a restart.

Each batch runs as one task on the server's event loop: it checks the input file, answers the
lines (`BatchLines`), and finishes by writing the output and error files and committing them with
the batch's final status in one transaction. Everything it knows is in the store, so a server
killed at any point resumes each batch where its records end: `validating` checks again,
`in_progress` answers the lines that have no output yet, `finalizing` writes the files again, and
`cancelling` becomes `cancelled`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from flyteplugins_batcher.jobs._driver import UnrecoverableRunError
from flyteplugins_batcher.server._batch_jobs import ACTIVE, TRANSITIONS, moved, validation_errors
from flyteplugins_batcher.server._batch_lines import scan_input, seconds_left, unanswered_records
from flyteplugins_batcher.server._errors import APIError
from flyteplugins_batcher.server._files import FileStore, shown
from flyteplugins_batcher.server._in_process import InProcessExecutor
from flyteplugins_batcher.server._inference import Inference
from flyteplugins_batcher.server._settings import ServerSettings
from flyteplugins_batcher.server._store import Store

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
        self.executor = InProcessExecutor(store, files, inference, settings)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancelled: dict[str, asyncio.Event] = {}  # set once a batch is cancelled: its lines in flight stop

    def resume(self) -> int:
        """Start every batch left unfinished by the last run of the server; returns how many."""
        unfinished = self.store.batches_in(ACTIVE)
        for batch in unfinished:
            logger.info("resuming batch %s (%s)", batch["id"], batch["status"])
            self.start(batch["id"])
        return len(unfinished)

    def start(self, batch_id: str) -> None:
        """Run a batch in the background (once: a batch already running is left alone)."""
        if batch_id not in self._tasks:
            task = asyncio.create_task(self._drive(batch_id), name=f"batch-{batch_id}")
            self._tasks[batch_id] = task
            task.add_done_callback(lambda _: self._tasks.pop(batch_id, None))

    def cancel(self, batch_id: str) -> dict[str, Any]:
        """Cancel a batch: no new line starts, lines in flight stop; answered lines stay in the output. Idempotent.

        Raises:
            APIError: 404 for no such batch; 400 for a batch that has already ended otherwise.
        """
        batch = self.get(batch_id)
        if batch["status"] in ("cancelling", "cancelled"):
            return batch
        if batch["status"] not in ("validating", "in_progress"):
            raise APIError(400, f"Cannot cancel a batch with status {batch['status']!r}.", code="batch_not_cancellable")
        batch = moved(batch, "cancelling")
        self.store.update_batch(batch)
        self._cancel_event(batch_id).set()
        self.start(batch_id)  # finishes it at once when nothing runs it; else its task stops its lines
        return batch

    def get(self, batch_id: str) -> dict[str, Any]:
        """A batch's object.

        Raises:
            APIError: 404 when there is no such batch.
        """
        batch = self.store.batch(batch_id)
        if batch is None:
            raise APIError(404, f"No such batch{shown(batch_id)}", code="batch_not_found", param="batch_id")
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
            batch = self.get(batch_id)
            if batch["status"] == "validating":
                batch = await self._validate(batch)
            if batch["status"] == "in_progress":
                batch = await self._answer(batch)
            if batch["status"] in ("in_progress", "finalizing", "cancelling"):
                await self._finish(batch)
        except asyncio.CancelledError:
            raise
        except APIError as error:  # said for a client: its message names no path and no exception
            logger.warning("batch %s failed: %s", batch_id, error.message)
            await self._fail(batch_id, error.code or "server_error", error.message)
        except Exception:
            # The traceback goes to the log; the batch's errors, which its client reads, say only where to look.
            incident = secrets.token_hex(6)
            logger.exception("batch %s failed (error id %s)", batch_id, incident)
            message = f"The server failed while running this batch (error id {incident}; its log has it)."
            await self._fail(batch_id, "server_error", message)
        finally:
            self._cancelled.pop(batch_id, None)

    async def _validate(self, batch: dict[str, Any]) -> dict[str, Any]:
        path = self.files.content(batch["input_file_id"], param="input_file_id")  # gone: the batch fails, saying so
        total, errors = await asyncio.to_thread(scan_input, path, batch["endpoint"])
        batch = self.get(batch["id"])  # it may have been cancelled meanwhile
        if batch["status"] != "validating":
            return batch
        if errors:
            batch = moved(batch, "failed", errors=validation_errors(errors))
        else:
            batch = moved(batch, "in_progress", request_counts={"total": total, "completed": 0, "failed": 0})
        self.store.update_batch(batch)
        return batch

    async def _answer(self, batch: dict[str, Any]) -> dict[str, Any]:
        try:
            await self.executor.answer(batch, cancelled=self._cancel_event(batch["id"]))
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
        if batch["status"] == "cancelling":
            final = "cancelled"
        elif batch["status"] == "in_progress" and seconds_left(batch) <= 0 and not _all_answered(batch):
            final = "expired"
        else:
            final = "completed"
            if batch["status"] == "in_progress":
                batch = moved(batch, "finalizing")
                self.store.update_batch(batch)
        await self._end(batch, final)

    async def _end(self, batch: dict[str, Any], final: str, **fields: Any) -> None:
        """Give every line without output its error line, write the files, commit them with the final status."""
        unanswered = await asyncio.to_thread(self._fail_unanswered, batch, *_UNANSWERED[final])
        if unanswered and final == "completed":
            logger.warning("batch %s: %d lines got no answer; they are in the error file", batch["id"], unanswered)
        output, errors = await asyncio.to_thread(self._write_files, batch["id"])
        current = self.get(batch["id"])
        counts = current["request_counts"]
        if not counts.get("total"):  # cancelled before validation counted its lines: each one is in a file now
            fields = {"request_counts": {**counts, "total": counts["completed"] + counts["failed"]}, **fields}
        ended = moved(current, final, output_file_id=output["id"], error_file_id=errors["id"], **fields)
        self.store.update_batch(ended, files=[output, errors])
        logger.info("batch %s %s: %s", batch["id"], final, ended["request_counts"])

    def _fail_unanswered(self, batch: dict[str, Any], code: str, message: str) -> int:
        path = self.files.path(batch["input_file_id"])
        if not path.is_file():  # its input is gone (the reason it failed): the lines it has are what it answered
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
        batch = self.store.batch(batch_id)
        if batch is None or "failed" not in TRANSITIONS.get(batch["status"], ()):
            return
        errors = validation_errors([{"code": code, "message": message, "param": None, "line": None}])
        if batch["status"] == "validating":
            self.store.update_batch(moved(batch, "failed", errors=errors))
        else:
            await self._end(batch, "failed", errors=errors)

    def _cancel_event(self, batch_id: str) -> asyncio.Event:
        return self._cancelled.setdefault(batch_id, asyncio.Event())


def _all_answered(batch: dict[str, Any]) -> bool:
    """Whether every line of a batch has its output (its counts as the store holds them)."""
    counts = batch["request_counts"]
    return counts["completed"] + counts["failed"] >= counts["total"]
