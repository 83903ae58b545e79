"""Memory stays flat: nothing is kept per record once it completes."""

from __future__ import annotations

import gc
import tracemalloc

import flyteplugins_batcher as ours


def identity(batch: list[int]) -> list[int]:
    return batch


async def test_no_per_record_growth_after_records_complete():
    async with ours.DynamicBatcher(identity, max_batch_size=64) as batcher:
        await batcher.run(range(5_000))  # warm up: histogram buckets, thread pool, caches
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            await batcher.run(range(30_000))
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert batcher.stats.total_completed == 35_000
    assert growth < 64 * 1024, f"grew {growth} bytes over 30k records"
