"""Memory stays flat: nothing is kept per record once it completes."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

import flyteplugins_batcher as ours


def identity(batch: list[int]) -> list[int]:
    return batch


class Payload:
    """A record that is large enough for a leak of records to show."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.blob = bytes(256)


async def submit_all(batcher: ours.DynamicBatcher, count: int, deadline_s: float | None) -> None:
    futures = [await batcher.submit(Payload(index), deadline_s=deadline_s) for index in range(count)]
    for future in futures:
        await future


@pytest.mark.parametrize("deadline_s", [None, 3600.0], ids=["no-deadline", "long-deadline"])
async def test_no_per_record_growth_after_records_complete(deadline_s: float | None):
    async with ours.DynamicBatcher(identity, max_batch_size=64) as batcher:
        await submit_all(batcher, 5_000, deadline_s)  # warm up: histogram buckets, thread pool, caches
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            await submit_all(batcher, 30_000, deadline_s)  # 30k deadlines an hour away: none fires
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert batcher.stats.total_completed == 35_000
    # A leaked record holds over 300 bytes (its 256-byte payload, envelope and future): 30k of them
    # would be over 9 MB. What may legitimately grow is far smaller: the stats' log-scale histograms
    # gain a bucket for each new latency value (about a thousand at most), and whatever is in flight
    # at the snapshot; on a loaded machine that reached 75 KB, so the bound leaves room for it.
    assert growth < 256 * 1024, f"grew {growth} bytes over 30k records ({growth / 30_000:.1f} per record)"
