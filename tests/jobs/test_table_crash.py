"""A table run killed with `kill -9` mid-run, then run again: only the chunks that had not finished reach the engine.

The first run is the real command in a process of its own (`flyteplugins-batcher run-table`), one
chunk at a time, on a slowed simulated engine; it is killed once its progress line says some chunks
are done. The rerun goes through flyte's local runner in this process, with the same inputs and a
`CountingBatcher` around the engine: it must reuse every chunk the killed run reported, and send
each other row to the engine once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flyteplugins_batcher.jobs import RunSummary, run_table
from tests.jobs.conftest import CountingBatcher

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
ROWS = 12
SLOW = json.dumps({"time_scale": 0.05})  # an H100's 7 ms step takes 140 ms: a chunk of 16 tokens, about 2.5 s
JOB = {"prompt": "{question}", "chunk_size": 2, "max_chunks_in_flight": 1, "engine": "simulated", "engine_args": SLOW}
PROGRESS = re.compile(r"progress: (\d+)/12 rows")


def killed_after_some_chunks(command: list[str], cwd: Path, at_least: int) -> int:
    """Run the command until its progress line reports `at_least` rows done, then `kill -9` it; those rows."""
    environment = {**os.environ, "BATCH_PROGRESS_INTERVAL_S": "0", "PYTHONUNBUFFERED": "1"}  # a line per chunk
    process = subprocess.Popen(command, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    deadline, seen = time.monotonic() + 300, []
    try:
        for line in iter(process.stdout.readline, b""):
            seen.append(line.decode(errors="replace"))
            found = PROGRESS.search(seen[-1])
            if found and int(found.group(1)) >= at_least:
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=60)
                return int(found.group(1))
            assert time.monotonic() < deadline, "".join(seen[-20:])
    finally:
        if process.poll() is None:
            process.kill()
    raise AssertionError(f"the run ended before it was killed:\n{''.join(seen[-20:])}")


def test_a_rerun_after_kill_9_sends_only_what_had_not_finished(cached_run, tmp_path: Path):
    marker = uuid.uuid4().hex[:8]
    questions = [f"Question {n} ({marker})?" for n in range(ROWS)]
    pq.write_table(pa.table({"question": questions}), tmp_path / "q.parquet")
    options = [f"--{name.replace('_', '-')}={value}" for name, value in JOB.items()]
    command = [str(BIN / "flyteplugins-batcher"), "run-table", "-i", "q.parquet", "-o", "out", "--max-new-tokens=16"]

    done = killed_after_some_chunks([*command, *options], tmp_path, at_least=4)

    assert not list((tmp_path / "out").glob("*.parquet"))  # killed before it published anything
    healthy = CountingBatcher()
    summary: RunSummary = cached_run(
        run_table,
        healthy,
        input=str(tmp_path / "q.parquet"),
        output_dir=str(tmp_path / "out"),
        max_new_tokens=16,
        **JOB,
    )

    assert done <= summary.reused < ROWS  # what the killed run reported done, at least, and not everything
    assert sorted(healthy.prompts) == sorted(questions[summary.reused :])  # the rest, each once, in whole chunks
    assert summary.reused % 2 == 0 and (summary.answered, summary.failed) == (ROWS, 0)
    assert pq.read_table(tmp_path / "out").column("question").to_pylist() == questions
