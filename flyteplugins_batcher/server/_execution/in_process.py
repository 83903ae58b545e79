"""The in-process batch executor: a batch's lines answered by the server's own engine, a chunk at a time.

The local default (`--batch-executor in-process`). `BatchRunner` owns a batch's status; this
answers its lines (`BatchLines`) until each has its output, the batch is cancelled or its window
closes, recording every chunk's answers in the store as they come.
"""

from __future__ import annotations

import asyncio
from typing import Any

from flyteplugins_batcher import size_in_flight
from flyteplugins_batcher.batch_api import ENDPOINTS
from flyteplugins_batcher.replica import LineRules
from flyteplugins_batcher.server._execution.batch_lines import BatchLines, seconds_left
from flyteplugins_batcher.server._inference import Inference
from flyteplugins_batcher.server._settings import ServerSettings
from flyteplugins_batcher.server._state.files import FileStore
from flyteplugins_batcher.server._state.store import Store


class InProcessExecutor:
    """Answers a batch's lines with the server's own engine.

    Args:
        store: The batches and their answered lines.
        files: The input files.
        inference: What answers the lines.
        settings: Chunk sizes and the engine's generation defaults.

    Example:
        ```python
        executor = InProcessExecutor(store, files, inference, settings)
        await executor.answer(batch, cancelled=asyncio.Event())
        ```
    """

    def __init__(self, store: Store, files: FileStore, inference: Inference, settings: ServerSettings) -> None:
        self.store = store
        self.files = files
        self.inference = inference
        self.settings = settings

    async def answer(self, batch: dict[str, Any], *, cancelled: asyncio.Event) -> None:
        """Answer the lines that have no output yet, until all have one, `cancelled` is set or the window closes.

        Raises:
            UnrecoverableRunError: The engine cannot run the batch at all.
        """
        path = await asyncio.to_thread(self.files.content, batch["input_file_id"], param="input_file_id")
        lines = BatchLines(
            batch,
            path,
            self._rules(batch["endpoint"]),
            store=self.store,
            inference=self.inference,
            chunk_size=self.settings.batch_chunk_size,
            order=self.settings.batch_order,
            chunks_in_flight=self._chunks_in_flight(),
            should_stop=lambda: cancelled.is_set() or seconds_left(batch) <= 0,
            cancelled=cancelled,
        )
        await lines.answer()

    def _rules(self, endpoint: str) -> LineRules:
        inference = self.inference
        engine = inference.engine
        classifier, embedding = inference.classifier, inference.embedding_replica
        return LineRules(
            served_model=inference.served_model,
            served_embedding_model=inference.embedding_model or "",
            model_mismatch="error",
            defaults=self.settings.engine.generation(),
            endpoints=(endpoint,) if endpoint in ENDPOINTS else (),
            context_length=engine.context_length if engine is not None else 0,  # a max_tokens past it fails at parse
            adapters=inference.adapters,
            tool_parser=self.settings.engine.tool_call_parser,
            classifier=self.settings.engine.model if classifier is not None else "",
            classifier_tasks=classifier.model.tasks if classifier is not None else (),
            embedding_tasks=embedding.model.tasks if embedding is not None else (),
        )

    def _chunks_in_flight(self) -> int:
        if self.settings.batch_chunks_in_flight:
            return self.settings.batch_chunks_in_flight
        engine = self.inference.engine
        capacity = engine.stats.max_num_seqs if engine is not None else 0
        return size_in_flight(capacity or 16, chunk_size=self.settings.batch_chunk_size).concurrency
