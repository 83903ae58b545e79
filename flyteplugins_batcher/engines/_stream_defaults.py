"""Batcher settings for an engine that schedules requests itself (vLLM's `AsyncLLM`, the simulated engine)."""

from __future__ import annotations

from flyteplugins_batcher._settings import BatcherSettings

STREAM_OVERCOMMIT = 2
"""Estimated tokens in flight may reach this multiple of the KV cache: estimates count every record's
full `max_new_tokens` although most stop earlier, and the engine needs a waiting queue to refill
slots the moment sequences finish."""


def stream_batcher_settings(max_num_seqs: int, kv_cache_tokens: int) -> BatcherSettings:
    """Batches of one record dispatched at once, up to `max(1024, 4 * max_num_seqs)` in flight, and
    estimated tokens in flight bounded at `STREAM_OVERCOMMIT` KV caches: each record reaches the
    engine the moment it arrives, and the engine's own continuous batching fills its slots."""
    return BatcherSettings(
        max_batch_size=1,
        batch_timeout_s=0.0,
        max_concurrent_batches=max(1024, 4 * max_num_seqs),
        max_inflight_cost=STREAM_OVERCOMMIT * kv_cache_tokens,
    )
