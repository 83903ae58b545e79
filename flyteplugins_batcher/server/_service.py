"""The server's parts, built from its settings and started and stopped together: one per app.

Starting loads the models (so `/health` says ready only once requests can be answered), removes
what a crash left half-written, resumes every unfinished batch it can claim, and starts keeping
its leases (`LeaseKeeper`); stopping stops the batches' tasks (their state stays in the store),
gives their leases up for another replica to take at once, and closes the models.

The jobs' database is SQLite in the data folder, this server's alone (at start it takes every
unfinished batch), or PostgreSQL at `database_url`, shared by replicas (each takes only the
batches nobody holds), which share their files through one data folder or one `files_uri`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated

from fastapi import Depends, Request

from flyteplugins_batcher import BatcherSettings
from flyteplugins_batcher.engines import EngineStats
from flyteplugins_batcher.server._admission import OnlineTarget
from flyteplugins_batcher.server._execution.leases import LeaseKeeper
from flyteplugins_batcher.server._execution.runner import BatchRunner
from flyteplugins_batcher.server._inference import Inference
from flyteplugins_batcher.server._metrics import ServerMetrics
from flyteplugins_batcher.server._settings import ServerSettings
from flyteplugins_batcher.server._state.files import FileStore
from flyteplugins_batcher.server._state.statuses import ACTIVE
from flyteplugins_batcher.server._state.store import Store, shown_url

logger = logging.getLogger("flyteplugins_batcher.server")

SHARED_LEFTOVERS_AGE_S = 15 * 60.0
"""With a shared database, files without a row are removed at start only once untouched this long:
until then they may be another live replica's upload or output file in the making."""


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
        if not settings.lease_s > 0:
            raise ValueError(f"lease_s must be > 0, got {settings.lease_s}")
        self.shared = bool(settings.database_url)
        self.store = Store(settings.database_url or settings.data_dir / "server.db", lease_s=settings.lease_s)
        self.files = FileStore(
            settings.data_dir / "files", self.store, max_bytes=settings.max_upload_bytes, files_uri=settings.files_uri
        )
        self.metrics = ServerMetrics(
            batchers={"llm": lambda: self.inference.llm_stats, "embeddings": lambda: self.inference.embedding_stats},
            engine=self._engine_stats,
            batch_jobs=lambda: [batch["status"] for batch in self.store.batches_in(_ALL_STATUSES)],
            online_admission=lambda: self.inference.admission.stats() if self.inference.admission is not None else None,
        )
        target = OnlineTarget(settings.online_ttft_slo_s, settings.online_tpot_slo_s, settings.online_slo_quantile)
        self.inference = Inference(
            settings.engine,
            embeddings=settings.embeddings,
            llm_observers=[self.metrics.observer("llm")],
            embedding_observers=[self.metrics.observer("embeddings")],
            online_target=target,
            on_online_times=self.metrics.online_times,
        )
        self.runner = BatchRunner(self.store, self.files, self.inference, settings)
        self.leases = LeaseKeeper(self.store, self.runner, interval_s=settings.lease_s / 3)
        self.ready = False
        self.started_at = int(time.time())

    async def start(self) -> None:
        """Load the models, clean up after a crash, resume the unfinished batches it can claim, keep their leases."""
        logger.info("server %s: jobs in %s", self.store.owner, shown_url(self.store.url))
        removed = self.files.remove_leftovers(older_than_s=SHARED_LEFTOVERS_AGE_S if self.shared else 0.0)
        if removed:
            logger.info("removed %d half-written files left by a crash", removed)
        await self.inference.load()
        resumed = self.runner.resume(take_over=not self.shared)
        self.leases.start()
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
        """Stop the batches' tasks and give up their leases (they resume at once elsewhere, or at the next start)."""
        self.ready = False
        await self.leases.stop()
        await self.runner.aclose()
        try:
            released = await asyncio.to_thread(self.store.release)
        except Exception:  # the database away: the leases lapse instead
            logger.exception("could not give up this server's batch leases; they lapse in %s s", self.settings.lease_s)
        else:
            if released:
                logger.info("gave up %d unfinished batches for another server (or the next start) to resume", released)
        await self.inference.aclose()
        self.store.close()

    def batcher_settings(self, batcher: str) -> BatcherSettings | None:
        """The settings of the running batcher labelled `batcher` (`llm`, `embeddings`), or `None` before it runs."""
        if batcher == "llm":
            running = self.inference.replica.shared.batcher
        else:
            replica = self.inference.embedding_replica
            running = replica.embed.batcher if replica is not None else None
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
