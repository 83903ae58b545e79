"""`make gpu-check`, the first script to run on a lent GPU, runs its whole code path on this CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_gpu_check_runs_on_a_cpu_and_writes_both_tables(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    command = [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--quick", "--out", str(out)]

    run = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)

    assert run.returncode == 0, run.stderr[-3000:]
    assert "## The device's busy share with CPU work per record" in run.stdout
    assert "## The Transformers engine on CPU" in run.stdout
    found = json.loads(out.read_text())
    assert {row["way"] for row in found["busy"]} >= {"serial", "ours", "ours + preparation in 8 processes"}
    assert [row["mode"] for row in found["engine"]] == [
        "one prompt at a time",
        "generate(all prompts at once)",
        "ours: engine.batcher()",
    ]
    assert all(row["tokens_per_s"] > 0 for row in found["engine"])
