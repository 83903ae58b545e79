"""How much work a driver keeps in flight on replicas that each run a continuous-batching engine (vLLM).

A driver cuts a job into chunks and sends each to a replica as one call; a replica runs up to
`concurrency` calls at once, and all of them feed its one engine. The engine runs at full speed
only while at least `max_num_seqs` requests are unfinished on its replica; `size_in_flight` sizes
the chunks, the calls per replica and the driver's cap so that this holds, derived from the
engine's capacity and the number of replicas rather than tuned by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_CHUNK_SIZE = 8
"""Requests per call: small, so that a long request pins few finished siblings (see `size_in_flight`)."""

DEFAULT_HEADROOM = 4.0
"""Requests in flight per replica, in multiples of the engine's `max_num_seqs`."""


@dataclass(frozen=True)
class InFlight:
    """Chunk size, calls per replica and the driver's cap, sized to the engines they feed.

    Attributes:
        chunk_size: Requests per call (a call carries one chunk, and is what is retried and cached).
        concurrency: Calls running at once on one replica (further calls wait for one to end).
        chunks_in_flight: Calls outstanding at once over all replicas: `replicas x concurrency`,
            so that every replica runs `concurrency` calls and adding replicas adds work in flight.
        requests_per_replica: Requests one replica holds when it runs `concurrency` calls:
            `chunk_size x concurrency`.

    Example:
        ```python
        sized = size_in_flight(max_num_seqs=256, replicas=8)
        sized.chunk_size, sized.concurrency, sized.chunks_in_flight  # (8, 128, 1024)
        ```
    """

    chunk_size: int
    concurrency: int
    chunks_in_flight: int
    requests_per_replica: int


def size_in_flight(
    max_num_seqs: int,
    replicas: int = 1,
    *,
    chunk_size: int | None = None,
    headroom: float = DEFAULT_HEADROOM,
) -> InFlight:
    """Chunk size, per-replica concurrency and driver cap that keep every replica's engine full.

    The rule: each replica holds `headroom x max_num_seqs` requests (4x by default) in chunks of
    `chunk_size` (8 by default, never more than `max_num_seqs`), so `concurrency =
    ceil(headroom x max_num_seqs / chunk_size)`, and the driver keeps `replicas x concurrency`
    chunks in flight. Why 4x the engine's capacity:

    - 1x runs: the engine's `max_num_seqs` sequences.
    - About 2x is pinned by long requests. A call holds its place on the replica until the last request
      of its chunk finishes, so its finished requests are dead weight until then. When 5% of
      requests generate 10x the tokens of the rest (2,000 against about 200), a chunk of 8 holds
      a long one a third of the time and then lives about 10x longer: on average a call's chunk
      holds about 3x the requests that still run. Larger chunks pin more (chunks of 32: about
      6x), which is why the chunk size stays small whatever the engine's capacity.
    - The rest covers each call's round trip (the finished chunk's result travels back, the next
      call travels out; 0.5 s each way is about 1.5% of a call's time with chunks of 8) and the
      spread of output lengths.

    The engine's own scheduler does the rest: the extra requests wait in its queue and take a
    slot the moment a sequence finishes. Raise `headroom` with `chunk_size`, or for outputs
    with a longer tail than the case above.

    Args:
        max_num_seqs: Sequences one replica's engine runs at once (vLLM's `max_num_seqs`: 256 by
            default, 1024 on GPUs of 70 GiB or more other than the A100 since vLLM 0.9).
        replicas: Replicas the driver feeds.
        chunk_size: Requests per call; by default `min(8, max_num_seqs)`. Larger chunks mean
            fewer calls, each pinning more requests behind its longest one.
        headroom: Requests in flight per replica, in multiples of `max_num_seqs`.

    Raises:
        ValueError: A size below 1, or headroom below 1 (a replica must at least fill its engine).

    Example:
        ```python
        sized = size_in_flight(1024, replicas=4)  # vLLM on H100s
        sized.chunk_size, sized.concurrency, sized.chunks_in_flight  # (8, 512, 2048)
        ```
    """
    for name, value in (("max_num_seqs", max_num_seqs), ("replicas", replicas), ("chunk_size", chunk_size or 1)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not headroom >= 1:
        raise ValueError(f"headroom must be >= 1 (a replica must at least fill its engine), got {headroom}")
    size = chunk_size or min(DEFAULT_CHUNK_SIZE, max_num_seqs)
    concurrency = math.ceil(headroom * max_num_seqs / size)
    return InFlight(size, concurrency, replicas * concurrency, size * concurrency)
