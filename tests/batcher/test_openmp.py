"""A model warmed up on the main thread, then run by the batcher's worker thread: one OpenMP pool, no sleeps.

Two threads that have run torch's CPU kernels hold two GNU OpenMP pools; past one OpenMP thread per
core, every pool's workers sleep between parallel regions, and each region pays wake-ups (seen as
voluntary context switches). The batcher gives the event-loop thread's pool up when it starts its
worker threads, so the model's thread holds the only one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="needs torch (the cpu extra)")

REGIONS = 2000
"""Parallel regions the model runs: element-wise adds over tensors large enough for torch to use 2 threads."""

SCRIPT = textwrap.dedent(
    f"""
    import asyncio, json, resource, threading
    try:  # a second GNU OpenMP runtime, bundled with scikit-learn, loaded before torch's: each keeps its pools
        import sklearn.utils._openmp_helpers
    except ImportError:
        pass
    import torch
    from flyteplugins_batcher import DynamicBatcher, release_openmp_pool

    torch.set_num_threads(2)
    a, b = torch.randn(200_000), torch.randn(200_000)

    def model(batch):
        for _ in range({REGIONS}):
            torch.add(a, b)
        return batch

    def switches(run):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        run()
        return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - before

    def in_a_thread_of_its_own():
        thread = threading.Thread(target=model, args=([1],))
        thread.start()
        thread.join()

    async def through_a_batcher():
        async with DynamicBatcher(model) as batcher:
            return await batcher.submit(1)

    def runtimes():
        with open("/proc/self/maps") as maps:
            return len({{line.split(maxsplit=5)[5] for line in maps if "/libgomp" in line}})

    model([0])  # the warm-up, on the main thread: it now holds an OpenMP pool
    print(json.dumps({{
        "plain thread": switches(in_a_thread_of_its_own),
        "batcher": switches(lambda: asyncio.run(through_a_batcher())),
        "runtimes loaded": runtimes(),
        "runtimes released": release_openmp_pool(),
    }}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="GNU OpenMP is torch's runtime on Linux")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: torch runs no parallel regions")
def test_the_model_thread_holds_the_only_openmp_pool() -> None:
    finished = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    switches = json.loads(finished.stdout.splitlines()[-1])

    # Without the release: sleeps and wake-ups in most regions (the same work a plain thread does). Other
    # processes' load moves both counts (a loaded machine read 4,003 and 139, a quiet one thousands and 7-12):
    # the signal is their ratio, about 1 without the release.
    assert switches["plain thread"] > REGIONS // 4, switches
    assert switches["batcher"] < switches["plain thread"] / 10, switches
    assert switches["runtimes released"] == switches["runtimes loaded"] >= 1, switches


def test_a_process_without_gnu_openmp_has_nothing_to_release() -> None:
    script = "import sys, flyteplugins_batcher as b; print(b.release_openmp_pool(), 'torch' in sys.modules)"
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert finished.stdout.split() == ["0", "False"], finished.stderr
