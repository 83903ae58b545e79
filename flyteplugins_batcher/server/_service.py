"""The server's parts, built from its settings and started and stopped together: one per app.

Starting loads the models (so `/health` says ready only once requests can be answered), removes
what a crash left half-written, and resumes every unfinished batch; stopping stops the batches'
tasks (their state stays in the store) and closes the models.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated

from fastapi import Depends, Request

from flyteplugins_batcher import BatcherSettings
from flyteplugins_batcher.engines import EngineStats
from flyteplugins_batcher.jobs._embeddings import embed
from flyteplugins_batcher.server._batch_jobs import ACTIVE
from flyteplugins_batcher.server._batch_runner import BatchRunner
from flyteplugins_batcher.server._files import FileStore
from flyteplugins_batcher.server._inference import Inference
from flyteplugins_batcher.server._metrics import ServerMetrics
from flyteplugins_batcher.server._settings import ServerSettings
from flyteplugins_batcher.server._store import Store

logger = logging.getLogger("flyteplugins_batcher.server")


class Service:
    """Settings, state, models, batch runner and metrics of one server.

    Args:
        settings: What to serve and where to keep it.

    Example:
        ```python
        service = Service(ServerSettings.from_environment())
        await service.start()
        ...
        await service.stop()
        ```
    """

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.store = Store(settings.data_dir / "server.db")
        self.files = FileStore(settings.data_dir / "files", self.store, max_bytes=settings.max_upload_bytes)
        self.metrics = ServerMetrics(
            batchers={"llm": lambda: self.inference.llm_stats, "embeddings": lambda: self.inference.embedding_stats},
            engine=self._engine_stats,
            batch_jobs=lambda: [batch["status"] for batch in self.store.batches_in(_ALL_STATUSES)],
        )
        self.inference = Inference(
            settings.engine,
            embeddings=settings.embeddings,
            llm_observers=[self.metrics.observer("llm")],
            embedding_observers=[self.metrics.observer("embeddings")],
        )
        self.runner = BatchRunner(self.store, self.files, self.inference, settings)
        self.ready = False
        self.started_at = int(time.time())

    async def start(self) -> None:
        """Load the models, clean up after a crash, resume the unfinished batches."""
        removed = self.files.remove_leftovers()
        if removed:
            logger.info("removed %d half-written files left by a crash", removed)
        await self.inference.load()
        resumed = self.runner.resume()
        self.ready = True
        logger.info(
            "serving %s%s on %s:%d (%d batches resumed)",
            self.inference.served_model,
            f" and {self.inference.embedding_model}" if self.inference.embedding_model else "",
            self.settings.host,
            self.settings.port,
            resumed,
        )

    async def stop(self) -> None:
        """Stop the batches' tasks (they resume at the next start) and close the models and the store."""
        self.ready = False
        await self.runner.aclose()
        await self.inference.aclose()
        self.store.close()

    def batcher_settings(self, batcher: str) -> BatcherSettings | None:
        """The settings of the running batcher labelled `batcher` (`llm`, `embeddings`), or `None` before it runs."""
        if batcher == "llm":
            running = self.inference.replica.shared.batcher
        else:
            running = embed.batcher if self.inference.embedding_model else None
        return running.settings if running is not None else None

    def _engine_stats(self) -> EngineStats | None:
        engine = self.inference.engine
        return engine.stats if engine is not None else None


_ALL_STATUSES = (*ACTIVE, "completed", "failed", "expired", "cancelled")


def service_of(request: Request) -> Service:
    """The service of the app that got `request` (a FastAPI dependency)."""
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(service_of)]
"""A route's parameter for the app's `Service`."""
