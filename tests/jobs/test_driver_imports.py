"""A driver imports every workflow module, and its image has no model stack: importing must not load one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "sentence_transformers", "vllm")


def test_importing_the_workflows_loads_no_model_stack():
    probe = (
        "import json, sys\n"
        "import flyteplugins_batcher.jobs, flyteplugins_batcher.images\n"
        f"print(json.dumps([name for name in {HEAVY!r} if name in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_the_jobs_import_without_arrow_pandas_or_datasets():
    # The replicas' images import these modules to run their tasks and have no Arrow: only a driver reads tables.
    probe = (
        "import sys\n"
        "for name in ('pyarrow', 'pandas', 'datasets'):\n"
        "    sys.modules[name] = None  # importing it raises ImportError\n"
        "import flyteplugins_batcher.jobs as jobs\n"
        "print(jobs.run_table.name, jobs.TableProcessor(prompt='{q}').replicas[0].name)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["batch_table_driver.run_table", "batch_llm_gpu"]
