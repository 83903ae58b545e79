"""torch's CPU threads sized to the CPUs this process may use, and OpenMP workers that sleep rather than spin.

torch starts as many OpenMP threads as the machine has cores, whatever the process may use. In a
Kubernetes pod with a CPU limit (the cgroup's quota, `/sys/fs/cgroup/cpu.max`) or pinned to some
cores (`sched_getaffinity`), the surplus threads take turns on too few cores, and every parallel
region of a decoding step waits at its barrier for the one that was descheduled. So the
Transformers engine, where it loads, lowers torch's threads to what the process may use
(`usable_cpus`), unless the user chose them (`OMP_NUM_THREADS`, or the engine's `num_threads`).

GNU OpenMP's workers also spin between parallel regions, which starves a core that another process
needs too (a busy machine). `OMP_WAIT_POLICY=PASSIVE` has them sleep instead; GNU OpenMP reads it
when it loads, with torch, so `prefer_passive_waits` (unless the user chose a policy) imports torch
with it set, if torch is not imported yet, and takes it out of the environment again.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

logger = logging.getLogger("flyteplugins_batcher.engines")

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
"""cgroup v2's CPU limit of this process's group: `<quota> <period>` in microseconds, or `max <period>`."""

WAIT_POLICY = "OMP_WAIT_POLICY"
SPIN_COUNT = "GOMP_SPINCOUNT"
"""GNU OpenMP's own knob for how long idle workers spin (used when no policy is set): the user's choice too."""
THREADS = "OMP_NUM_THREADS"


def cgroup_cpu_limit(cpu_max: Path = CGROUP_CPU_MAX) -> float | None:
    """The CPUs the cgroup's quota allows (`quota / period`, 1.5 for `150000 100000`), or `None` without a limit.

    `None` too when the file is missing or unreadable (not Linux, cgroup v1): no limit is known.

    Raises:
        ValueError: The file says something else than `<quota> <period>` or `max <period>`, naming it.
    """
    try:
        text = cpu_max.read_text().strip()
    except OSError:
        return None
    fields = text.split()
    if len(fields) == 2 and fields[0] == "max":
        return None
    try:
        quota, period = (int(field) for field in fields)
    except ValueError:
        raise ValueError(f"{cpu_max}: expected '<quota> <period>' or 'max <period>', got {text!r}") from None
    if quota <= 0 or period <= 0:
        raise ValueError(f"{cpu_max}: quota and period must be positive, got {text!r}")
    return quota / period


def usable_cpus(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The CPUs this process may use: its CPU affinity, capped by the cgroup's quota (rounded up), at least 1.

    Example:
        ```python
        torch.set_num_threads(usable_cpus())  # 2 in a pod limited to 1.5 CPUs on a 64-core node
        ```
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    limit = cgroup_cpu_limit(cpu_max)
    if limit is not None:
        cpus = min(cpus, math.ceil(limit))
    return max(cpus, 1)


def size_torch_threads(
    torch: Any,
    chosen: int | None,
    *,
    reserve: int = 0,
    cpu_max: Path = CGROUP_CPU_MAX,
    environ: MutableMapping[str, str] = os.environ,
) -> int:
    """Set torch's intra-op threads once, where an engine loads; returns the number it runs with.

    Args:
        torch: The `torch` module.
        chosen: The engine's `num_threads`, when the user gave one: it is set as it is.
        reserve: CPUs left to the process's other threads (at least one thread stays for torch).
        cpu_max: The cgroup's CPU limit file.
        environ: The environment (`OMP_NUM_THREADS` set there is the user's choice: torch already follows it).
    """
    if chosen is not None:
        torch.set_num_threads(chosen)
    elif not environ.get(THREADS):
        usable = max(1, usable_cpus(cpu_max) - reserve)
        if torch.get_num_threads() > usable:  # never more than torch or the user chose
            logger.info(
                "torch threads: %d (the CPUs this process may use, %d left to its other threads)", usable, reserve
            )
            torch.set_num_threads(usable)
    return int(torch.get_num_threads())


ENCODER_RESERVED_CPUS = 1
"""CPUs an encoder on the CPU leaves to the rest of its process, as vLLM's CPU build does
(`VLLM_CPU_OMP_THREADS_BIND=auto` binds its model to all CPUs but one, which its front end keeps).

The process's other threads tokenize, batch, read and write while the model runs; on a busy 2-CPU
machine (load 6 to 10), all-MiniLM-L6-v2 embedded the same 513 texts in about half the time with
one torch thread as with two, whose parallel regions wait at a barrier for the one descheduled
(`docs/benchmarks/pooling.md`)."""


def size_encoder_threads(torch: Any, *, environ: MutableMapping[str, str] = os.environ) -> int:
    """Size torch's threads for an encoder on the CPU (an embedder, a cross-encoder): all CPUs but one, unless
    `OMP_NUM_THREADS` says otherwise; returns the number it runs with.

    Example:
        ```python
        size_encoder_threads(torch)  # 1 on a 2-CPU machine, 7 in a pod limited to 8 CPUs
        ```
    """
    return size_torch_threads(torch, None, reserve=ENCODER_RESERVED_CPUS, environ=environ)


def prefer_passive_waits(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Have OpenMP's idle workers sleep, not spin (`OMP_WAIT_POLICY=PASSIVE`), unless the user chose how they wait.

    A policy or a spin count set by the user (`OMP_WAIT_POLICY`, `GOMP_SPINCOUNT`: on a machine of one's own,
    `GOMP_SPINCOUNT=300000` is GNU OpenMP's own default, which is faster while no other process wants the
    cores) is left as it is.

    GNU OpenMP reads the policy once, when torch loads it: so torch is imported here with the policy set,
    and the variable is then taken out again, so that child processes (a vLLM engine's own, which tunes
    its OpenMP threads itself) start as they would have.

    Returns:
        Whether the policy is passive for the OpenMP runtime torch loaded (False once torch was imported
        before: the runtime read its environment then; False without torch).
    """
    if environ.get(WAIT_POLICY):
        return environ[WAIT_POLICY].upper() == "PASSIVE"
    if environ.get(SPIN_COUNT):
        return False
    if "torch" in sys.modules:
        logger.debug("torch was imported before the engine: OpenMP's wait policy stays as it was")
        return False
    environ[WAIT_POLICY] = "PASSIVE"
    try:
        import torch  # noqa: F401  (its OpenMP runtime reads the policy now)
    except ImportError:
        return False
    finally:
        del environ[WAIT_POLICY]
    return True
