"""torch's threads sized to the CPUs the process may use (affinity, the cgroup's CPU quota), and OpenMP's idle
workers sleeping rather than spinning; the cgroup's file is faked by its path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flyteplugins_batcher.engines._cpu_threads import (
    cgroup_cpu_limit,
    prefer_passive_waits,
    size_encoder_threads,
    size_torch_threads,
    usable_cpus,
)

AFFINITY = len(os.sched_getaffinity(0))


def cpu_max(folder: Path, text: str) -> Path:
    path = folder / "cpu.max"
    path.write_text(text + "\n")
    return path


@pytest.fixture
def torch_threads():
    """torch's threads as they were, put back after the test (they are process-wide)."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


@pytest.mark.parametrize(("text", "limit"), [("max 100000", None), ("150000 100000", 1.5), ("50000 100000", 0.5)])
def test_the_quota_is_read_as_cpus(tmp_path: Path, text: str, limit: float | None) -> None:
    assert cgroup_cpu_limit(cpu_max(tmp_path, text)) == limit


def test_no_file_means_no_known_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "absent") is None
    assert usable_cpus(tmp_path / "absent") == AFFINITY


@pytest.mark.parametrize("text", ["lots", "100000", "-1 100000", "100000 0"])
def test_a_file_that_says_something_else_fails_naming_it(tmp_path: Path, text: str) -> None:
    path = cpu_max(tmp_path, text)
    with pytest.raises(ValueError, match=str(path)):
        cgroup_cpu_limit(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max 100000", AFFINITY),  # no limit: the cores the process is pinned to
        ("50000 100000", 1),  # half a CPU still runs one thread
        ("150000 100000", min(AFFINITY, 2)),  # 1.5 CPUs: rounded up, never past the affinity
        (f"{100000 * (AFFINITY + 6)} 100000", AFFINITY),  # a limit above the cores it may run on
    ],
)
def test_usable_cpus_are_the_affinity_capped_by_the_quota(tmp_path: Path, text: str, expected: int) -> None:
    assert usable_cpus(cpu_max(tmp_path, text)) == expected


def test_a_pods_quota_lowers_torchs_threads(tmp_path: Path, torch_threads: int) -> None:
    torch.set_num_threads(AFFINITY + 2)  # torch's default counts the machine's cores, not the pod's
    assert size_torch_threads(torch, None, cpu_max=cpu_max(tmp_path, "100000 100000"), environ={}) == 1
    assert torch.get_num_threads() == 1


def test_it_never_raises_what_torch_or_the_user_chose(tmp_path: Path, torch_threads: int) -> None:
    torch.set_num_threads(1)
    assert size_torch_threads(torch, None, cpu_max=cpu_max(tmp_path, "max 100000"), environ={}) == 1


def test_omp_num_threads_or_the_engines_num_threads_win(tmp_path: Path, torch_threads: int) -> None:
    quota = cpu_max(tmp_path, "100000 100000")
    torch.set_num_threads(AFFINITY + 1)
    assert size_torch_threads(torch, None, cpu_max=quota, environ={"OMP_NUM_THREADS": "3"}) == AFFINITY + 1
    assert size_torch_threads(torch, 3, cpu_max=quota, environ={}) == 3


def test_an_encoder_leaves_one_cpu_to_the_rest_of_its_process(tmp_path: Path, torch_threads: int) -> None:
    quota = cpu_max(tmp_path, "400000 100000")  # 4 CPUs (where the machine has as many)
    torch.set_num_threads(64)
    expected = max(1, min(AFFINITY, 4) - 1)
    assert size_torch_threads(torch, None, reserve=1, cpu_max=quota, environ={}) == expected
    assert torch.get_num_threads() == expected
    torch.set_num_threads(64)
    assert size_encoder_threads(torch, environ={}) == max(1, usable_cpus() - 1)


def test_an_encoder_keeps_one_thread_and_the_users_choice(tmp_path: Path, torch_threads: int) -> None:
    torch.set_num_threads(4)
    assert size_torch_threads(torch, None, reserve=1, cpu_max=cpu_max(tmp_path, "100000 100000"), environ={}) == 1
    torch.set_num_threads(4)
    assert size_encoder_threads(torch, environ={"OMP_NUM_THREADS": "4"}) == 4


def test_a_wait_policy_the_user_chose_is_kept() -> None:
    environ = {"OMP_WAIT_POLICY": "active"}
    assert prefer_passive_waits(environ) is False and environ == {"OMP_WAIT_POLICY": "active"}
    assert prefer_passive_waits({"OMP_WAIT_POLICY": "passive"}) is True
    spinning = {"GOMP_SPINCOUNT": "300000"}  # GNU OpenMP's own default, for a machine of one's own
    assert prefer_passive_waits(spinning) is False and spinning == {"GOMP_SPINCOUNT": "300000"}


def test_once_torch_is_imported_the_policy_is_left_alone() -> None:
    assert "torch" in sys.modules  # this module imported it
    environ: dict[str, str] = {}
    assert prefer_passive_waits(environ) is False and environ == {}


def test_before_torch_loads_the_workers_are_told_to_sleep() -> None:
    """In a fresh process torch is imported with the policy set (its OpenMP runtime reads it then), and the
    variable is taken out again, so that child processes start as they would have."""
    code = (
        "import os, sys\n"
        "from flyteplugins_batcher.engines._cpu_threads import prefer_passive_waits\n"
        "assert 'torch' not in sys.modules\n"
        "print(prefer_passive_waits(), 'torch' in sys.modules, os.environ.get('OMP_WAIT_POLICY'))\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "None"]
