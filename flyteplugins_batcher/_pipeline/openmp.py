"""One OpenMP thread pool for the model: the event-loop thread gives its pool up when worker threads start.

GNU OpenMP, the runtime in PyTorch's Linux wheels, gives every OS thread that runs a parallel
region a pool of workers of its own. Once the process holds more OpenMP threads than cores, it
stops spin-waiting between parallel regions and puts the workers to sleep instead, so each of the
thousands of small ops of a decoding step pays a wake-up. That is what happens when a script warms
its model up on the main thread and then hands `generate` to a batcher, whose worker thread runs
it: two pools, and a CPU model about 20% slower (the README's `bench_own_model_cpu` figures).

The batcher calls `release_openmp_pool` on its event-loop thread whenever it starts worker threads
for a plain `def` process function, so the pool of the thread that runs the model is the only one
left. Should the loop thread run torch again, it gets a new pool. Nothing happens in a process
without GNU OpenMP (macOS, Windows, LLVM's or Intel's runtime, or no torch at all)."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

OMP_PAUSE_SOFT = 1
"""`omp_pause_soft` (OpenMP 5.0): free the threads, keep the settings."""

PROC_MAPS = Path("/proc/self/maps")


class _Libgomp:
    """The GNU OpenMP runtimes this process has loaded (torch's, and maybe scikit-learn's); it never loads one."""

    def __init__(self) -> None:
        self._libraries: dict[str, ctypes.CDLL] = {}
        self._modules_when_looked = -1

    def loaded(self) -> list[ctypes.CDLL]:
        # Reading the memory map costs about a millisecond, so look again only after new imports,
        # which are what load a libgomp (with torch, or with a package that bundles its own).
        if len(sys.modules) != self._modules_when_looked:
            self._modules_when_looked = len(sys.modules)
            for path in _libgomp_paths() - self._libraries.keys():
                library = _open_loaded(path)
                if library is not None:
                    self._libraries[path] = library
        return list(self._libraries.values())


def _libgomp_paths() -> set[str]:
    """The files of the libgomps mapped into this process (wheels rename theirs, `libgomp-<hash>.so.1`)."""
    try:
        maps = PROC_MAPS.read_text()
    except OSError:
        return set()
    fields = (line.split(maxsplit=5) for line in maps.splitlines())
    return {parts[5] for parts in fields if len(parts) == 6 and "/libgomp" in parts[5]}


def _open_loaded(path: str) -> ctypes.CDLL | None:
    try:
        library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except (OSError, AttributeError):
        return None
    return library if hasattr(library, "omp_pause_resource_all") else None


_libgomp = _Libgomp()


def release_openmp_pool() -> int:
    """Free the calling thread's GNU OpenMP worker threads, so that the threads running the model hold the only pool.

    Each GNU OpenMP runtime in the process (a package may bundle its own) keeps pools of its own;
    each is told.

    Returns:
        How many runtimes accepted the call (0 without GNU OpenMP; a runtime refuses inside a parallel region).

    Example:
        ```python
        model.generate(warm_up)  # on the main thread: it now holds an OpenMP pool
        release_openmp_pool()  # gone; the batcher's worker thread will hold the only one
        ```
    """
    return sum(library.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0 for library in _libgomp.loaded())
