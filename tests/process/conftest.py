"""Helpers for the plugin tests."""

from __future__ import annotations

import threading
import time


def worker_threads(prefix: str) -> list[threading.Thread]:
    """Live threads whose name starts with a batcher's name (its worker-thread prefix)."""
    return [thread for thread in threading.enumerate() if thread.name.startswith(prefix)]


def wait_for_worker_threads(prefix: str, at_most: int, timeout_s: float = 5.0) -> int:
    """Wait until at most `at_most` such threads are alive (a shut-down pool's threads exit on their own)."""
    deadline = time.monotonic() + timeout_s
    while len(worker_threads(prefix)) > at_most and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(worker_threads(prefix))
