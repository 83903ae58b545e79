"""size_in_flight: the values its rule gives, and what it refuses."""

from __future__ import annotations

import pytest

from flyteplugins_batcher import InFlight, size_in_flight


def test_a_replica_holds_four_times_its_engine_in_chunks_of_eight() -> None:
    assert size_in_flight(256) == InFlight(
        chunk_size=8, concurrency=128, chunks_in_flight=128, requests_per_replica=1024
    )


@pytest.mark.parametrize("replicas", [1, 2, 4, 8])
def test_adding_replicas_adds_chunks_in_flight(replicas: int) -> None:
    sized = size_in_flight(256, replicas)

    assert (sized.chunk_size, sized.concurrency, sized.chunks_in_flight) == (8, 128, 128 * replicas)


def test_a_larger_engine_gets_more_calls_of_the_same_size() -> None:
    # The share of a slot pinned by a chunk's longest request depends on the chunk's size, not on the engine's.
    assert size_in_flight(1024, 4) == InFlight(
        chunk_size=8, concurrency=512, chunks_in_flight=2048, requests_per_replica=4096
    )


def test_an_engine_smaller_than_a_chunk_gets_chunks_of_its_own_size() -> None:
    assert size_in_flight(4) == InFlight(chunk_size=4, concurrency=4, chunks_in_flight=4, requests_per_replica=16)


def test_a_chosen_chunk_size_or_headroom_resizes_the_calls_per_replica() -> None:
    assert size_in_flight(256, 2, chunk_size=32) == InFlight(32, 32, 64, 1024)
    assert size_in_flight(256, headroom=2.5).concurrency == 80
    assert size_in_flight(100, chunk_size=7) == InFlight(7, 58, 58, 406)  # rounded up: never less than asked


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs must be an integer >= 1"),
        ({"max_num_seqs": 256, "replicas": 0}, "replicas must be an integer >= 1"),
        ({"max_num_seqs": 256, "chunk_size": -1}, "chunk_size must be an integer >= 1"),
        ({"max_num_seqs": 256, "headroom": 0.5}, "headroom must be >= 1"),
    ],
)
def test_sizes_that_cannot_fill_an_engine_are_refused(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        size_in_flight(**arguments)
