"""The commands start vLLM before flyte: the wait for its engine process ends as soon as it can, never hangs."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time

from flyteplugins_batcher.cli._engine_flags import _until_engine_process_starts


def test_the_wait_ends_when_a_child_process_starts_or_the_load_ends_and_at_its_limit() -> None:
    loading: concurrent.futures.Future[object] = concurrent.futures.Future()
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(2,))
    child.start()
    try:
        started = time.monotonic()
        _until_engine_process_starts(loading, limit_s=30)
        assert time.monotonic() - started < 5  # the engine process (here, any child) is running
    finally:
        child.join()

    done: concurrent.futures.Future[object] = concurrent.futures.Future()
    done.set_exception(RuntimeError("the load failed"))  # the job reports it; the command does not wait
    started = time.monotonic()
    _until_engine_process_starts(done, limit_s=30)
    _until_engine_process_starts(loading, limit_s=0.2)  # nothing happens: the limit ends the wait
    assert time.monotonic() - started < 5
