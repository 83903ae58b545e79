"""A server's hold on its batches when several replicas share one database: renewed, watched, taken over.

Every unfinished batch has an owner (the server running it) and a lease in the store. Every third
of `lease_s`, `LeaseKeeper`:

1. renews the leases this server holds (one UPDATE of the rows it owns);
2. stops the batches another server has taken over (their writes would be refused anyway: fenced),
   and stops the lines of those another server moved to `cancelling` (a cancel request that went
   to another replica), so that they end `cancelled` here;
3. claims the unfinished batches whose lease lapsed (their server died or stalled) or that nobody
   holds, each with one compare-and-set UPDATE, and runs them from where their records end.

A replica killed with `kill -9` thus has its batches finished by another one `lease_s` later,
every line answered once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from flyteplugins_batcher.server._execution.runner import BatchRunner
from flyteplugins_batcher.server._state.store import Store

logger = logging.getLogger("flyteplugins_batcher.server")


class LeaseKeeper:
    """Renews this server's leases, follows cancels from other servers, takes over lapsed batches.

    Args:
        store: The shared database (its `owner` is this server's id).
        runner: What runs the batches.
        interval_s: Seconds between rounds: a third of the lease, so that two rounds may fail before it lapses.

    Example:
        ```python
        keeper = LeaseKeeper(store, runner, interval_s=settings.lease_s / 3)
        keeper.start()
        ...
        await keeper.stop()
        ```
    """

    def __init__(self, store: Store, runner: BatchRunner, *, interval_s: float) -> None:
        self.store = store
        self.runner = runner
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run the rounds in the background, the first at once."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="batch-leases")

    async def stop(self) -> None:
        """Stop the rounds (the leases lapse unless the store releases them)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def round(self) -> list[str]:
        """One round: renew, follow, take over; returns the batches claimed."""
        running = self.runner.running()  # before renewing: each of these was this server's when it started
        owned = await asyncio.to_thread(self.store.renew)
        lost = await asyncio.to_thread(self._lost, running - owned.keys())
        self.runner.keep(owned, lost)
        claimed = await asyncio.to_thread(self.store.claim_lapsed)
        for batch_id in claimed:
            logger.info("batch %s: its lease had lapsed; this server (%s) runs it now", batch_id, self.store.owner)
            self.runner.start(batch_id)
        return claimed

    def _lost(self, batch_ids: set[str]) -> list[str]:
        """Of the batches running here that this server no longer renews, those another server holds (not ended)."""
        leases = {batch_id: self.store.lease(batch_id) for batch_id in batch_ids}
        return [batch_id for batch_id, lease in leases.items() if lease is not None and lease.owner != self.store.owner]

    async def _loop(self) -> None:
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:  # the database away for a moment: the next round tries again
                logger.exception("renewing this server's batch leases failed; trying again")
            await asyncio.sleep(self.interval_s)
