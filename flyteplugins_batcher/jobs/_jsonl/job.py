"""The JSONL batch job on the driver: requests read from a file lazily, cut into chunks, results written as they come.

`Job` knows where the lines come from and where their answers go (a results file and an errors
file, with running counts and a progress line), and nothing of where chunks run:
`fan_out(job.chunks(n, m), infer, job.on_chunk, ...)` runs them with any `infer` callable that
takes both kinds of chunk. What a line becomes on its way is the replica layer's (`LineRules`).

**Mixed files.** Chat, completion and responses lines become `RequestChunk`s (for the LLM replicas),
embedding, score, rerank and classify lines `EmbeddingChunk`s (for the embedding replicas, or the
classifier's when the run's model is one); a chunk holds one kind only. Both come out of
one pass over the file, as one stream, in the order they fill up, and share the driver's cap on
chunks in flight: kinds that are interleaved in the file run side by side, and a file sorted by kind
runs one kind after the other. The driver holds at most the chunks in flight and one unfinished
chunk of each kind, whatever the file's size.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from flyteplugins_batcher.batch_api import EmbeddingRequest, ModelMismatch, ParsedRequest, RequestLineError, SeenIds
from flyteplugins_batcher.engines import EmbeddingModel
from flyteplugins_batcher.jobs._journal import JournalWriter
from flyteplugins_batcher.jobs._jsonl.models import ModelLanes
from flyteplugins_batcher.jobs._jsonl.outputs import LineOutputs, OrderedOutput, SplitOutputs
from flyteplugins_batcher.jobs._jsonl.spool import Spool
from flyteplugins_batcher.jobs._report import Progress
from flyteplugins_batcher.jobs._summary import Counts
from flyteplugins_batcher.replica import ChunkCutter, EngineSettings, FinishedLine, JobChunk, JobOutcome, LineRules


class Job:
    """One JSONL job on the driver: reads requests lazily, writes results and errors as they come.

    Args:
        input_path: The request file.
        folder: Where the results, errors, the table of seen ids and the spool are written.
        settings: The run's engine settings: its base models (a line naming one of them, or one of their
            adapters, runs on it), its generation defaults (a request's own win), its tool parser.
        served_model_name: The first model's name in result lines (empty: its reference as declared).
        served_embedding_model: The embedding model's name.
        embedding_tasks: What the embedding model does (`EmbeddingModel.tasks`).
        model_mismatch: What to do with a line naming another model ("error" or "ignore").
        journal: Also write every finished line, with its line number, to this run journal (for a follower
            such as the Batch API server; `flyteplugins_batcher/jobs/_journal.py`).
        order: How requests are cut into chunks (`RunOptions.order`: "prefix" or "file").
        window: Requests placed together in "prefix" order (`RunOptions.order_window`).
        output_file: Write every line's output to this one file of `folder`, in input order (`OrderedOutput`,
            as `vllm run-batch` writes it); empty: `results.jsonl` and `errors.jsonl` (`SplitOutputs`).

    Example:
        ```python
        job = Job(path, folder, settings, served_embedding_model="e", model_mismatch="error")
        await fan_out(job.chunks(8), infer, job.on_chunk, max_in_flight=16, phase=job.lanes.phase)
        job.close()
        ```
    """

    def __init__(
        self,
        input_path: Path,
        folder: Path,
        settings: EngineSettings,
        *,
        served_embedding_model: str,
        model_mismatch: ModelMismatch,
        served_model_name: str = "",
        embedding_tasks: tuple[str, ...] = EmbeddingModel.EMBEDDER_TASKS,
        journal: JournalWriter | None = None,
        order: str = "prefix",
        window: int = ChunkCutter.WINDOW,
        output_file: str = "",
    ) -> None:
        self.input_path = input_path
        self.order, self.window = order, window
        models = settings.served_models(served_model_name)
        classifier_tasks = settings.classifier_tasks()
        self.rules = LineRules(
            models[0].name,
            served_embedding_model,
            model_mismatch,
            settings.generation(),
            model_aliases=models[0].aliases,
            adapters=tuple(name for model in models for name in model.adapter_names),
            tool_parser=settings.tool_call_parser,
            models=models,
            classifier=settings.model if classifier_tasks else "",
            classifier_tasks=classifier_tasks,
            embedding_tasks=embedding_tasks,
        )
        self.lanes = ModelLanes(self.rules, settings.models_per_replica)
        self.outputs: LineOutputs = OrderedOutput(folder / output_file) if output_file else SplitOutputs(folder)
        self.counts = Counts()
        self.progress = Progress(f"Batch job {input_path.name}", total=0, total_known=False)
        self.started = time.time()
        """When the job started (epoch seconds): a chunk that finished before was reused from an earlier run."""
        self.journal = journal
        self._seen = SeenIds(folder)
        self._spool = Spool(folder)
        self._in_flight: dict[str, ParsedRequest] = {}  # requests of the chunks outstanding, by custom_id

    @property
    def served_embedding_model(self) -> str:
        return self.rules.served_embedding_model

    async def chunks(self, chunk_size: int, embedding_chunk_texts: int = 128) -> AsyncIterator[JobChunk]:
        """Chunks of valid requests, read from the file as they are needed; bad lines go to the errors file.

        A model of a later wave (`ModelLanes`) has its requests spooled while the file is read, and its
        chunks come once the file is read through, wave after wave.

        Args:
            chunk_size: Chat and completion requests per LLM chunk.
            embedding_chunk_texts: Texts per embedding chunk (a request is never split, so a chunk may hold more).
        """
        cutter = ChunkCutter(chunk_size, embedding_chunk_texts, self.order, self.window)
        for request in self._requests():
            lane = self.lanes.lane(request)
            if self.lanes.waits(lane):
                self._spool.add(lane or "", request)
                continue
            for chunk in self._add(cutter, request, lane):
                yield chunk
                await asyncio.sleep(0)  # let finished chunks write out between reads
        self.progress.total_known = True
        for chunk in cutter.rest():
            yield self._made(chunk)
        for lane in self._spool.lanes:
            for request in self._spool.take(lane):
                for chunk in self._add(cutter, request, lane):
                    yield chunk
            for chunk in cutter.rest(lane):
                yield self._made(chunk)

    def _add(self, cutter: ChunkCutter, request: ParsedRequest, lane: str | None) -> list[JobChunk]:
        """Take a request into the cutter; the chunks it completed, if any."""
        self._in_flight[request.custom_id] = request
        if isinstance(request, EmbeddingRequest):
            lane = self.rules.encoder_of(request)  # the embedding model's chunks, or the classifier's
        return [self._made(chunk) for chunk in cutter.add(request, lane or "")]

    def _made(self, chunk: JobChunk) -> JobChunk:
        """A chunk about to be sent, its model noted (from its first request's)."""
        self.lanes.made(chunk, self.lanes.lane(self._in_flight[chunk.items[0].key]))
        return chunk

    def _requests(self) -> Iterator[ParsedRequest]:
        with self.input_path.open("rb") as lines:
            for _, request in self.rules.read(lines, self._seen):
                self.progress.total += 1
                if isinstance(request, RequestLineError):
                    self._write(FinishedLine.failed(request))
                else:
                    yield request

    async def on_chunk(self, chunk: JobChunk, outcome: JobOutcome | None, reason: str) -> None:
        """Write a finished chunk's result lines and error lines (`None`: the chunk failed, for `reason`)."""
        requests = {item.key: self._in_flight.pop(item.key) for item in chunk.items}
        failed = 0
        for position, finished in enumerate(self.rules.answers(chunk, outcome, reason, requests)):
            assert finished is not None  # only a chunk told to stop leaves a line unanswered, and none is here
            fresh = outcome is None or not finished.ok or outcome.computed_since(position, self.started)
            self._write(finished, fresh=fresh, retried=outcome is not None and outcome.was_retried(position))
            failed += not finished.ok
        self.lanes.finished(chunk, failed)
        await self.progress.update(self.counts)
        if self.journal is not None:
            await self.journal.flush()

    def _write(self, finished: FinishedLine, *, fresh: bool = True, retried: bool = False) -> None:
        self.outputs.write(finished)
        if self.journal is not None:
            self.journal.add(finished)
        self.counts.count(
            failed=not finished.ok,
            completion_tokens=finished.output_tokens,
            prompt_tokens=finished.input_tokens,
            cached_tokens=finished.cached_tokens,
            fresh=fresh,
            retried=retried,
        )

    async def close_journal(self) -> None:
        """Write the journal's last segment (what finished since the one before)."""
        if self.journal is not None:
            await self.journal.close()

    def close(self) -> None:
        self.outputs.close()
        self._seen.close()
        self._spool.close()
