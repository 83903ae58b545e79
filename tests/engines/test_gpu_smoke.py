"""benchmarks/gpu_smoke.py without a GPU: it refuses clearly, and its dry run exercises both comparisons."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "gpu_smoke.py"
FAKES = REPO_ROOT / "tests" / "fakes"


def _run(*args: str, fake_vllm: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    if fake_vllm:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKES), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=240)


def test_without_cuda_it_exits_with_a_clear_message() -> None:
    completed = _run("--n", "4")

    assert completed.returncode == 1
    assert "gpu_smoke: no CUDA device is visible" in completed.stderr
    assert "--device cpu --tiny" in completed.stderr


def test_missing_data_is_named(tmp_path: Path) -> None:
    completed = _run("--device", "cpu", "--data", str(tmp_path / "nope.jsonl"))

    assert completed.returncode == 1
    assert f"no gsm8k data at {tmp_path / 'nope.jsonl'}" in completed.stderr


@pytest.mark.skipif(not (REPO_ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl").is_file(), reason="no gsm8k")
def test_cpu_dry_run_prints_both_tables() -> None:
    completed = _run(
        *("--device", "cpu", "--tiny", "--n", "6", "--max-new-tokens", "4", "--sequential-n", "2"), fake_vllm=True
    )

    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "(a) vLLM: batch mode vs stream mode" in out and "(b) Transformers: one at a time vs TokenBatcher" in out
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith(("| vllm", "| transformers"))
    ]
    assert [row[:4] for row in rows] == [
        ["vllm", "batch mode", "6", "0"],
        ["vllm", "stream mode", "6", "0"],
        ["transformers", "one at a time", "2", "0"],
        ["transformers", "TokenBatcher", "6", "0"],
    ]
    assert "vllm stream mode: TokenBatcher settings {'max_batch_size': 1" in out
