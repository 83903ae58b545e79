"""The progress line on a terminal, read from a real run of the command line: it shows the first answers within
seconds of the first one, not when the chunk that holds them ends.

The run (`flyteplugins-batcher gsm8k`, one chunk of 24 questions answered one after another) has a pseudo-terminal
as its stdout, as `make run` has. So that the test knows when the first answer came without trusting the line it
tests, the run's replica carries a batch observer that writes `FIRST-ANSWER` to the same terminal when the engine's
first record settles; each piece of output is stamped by the test's clock as it arrives.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIRST_LINE_WITHIN_S = 10.0
QUESTIONS = 24

LAUNCH = """
import sys
from flyteplugins_batcher.replica import LLMReplica
from flyteplugins_batcher.replica._llm import make_batcher


class FirstAnswer:
    seen = False

    def on_dispatch(self, size, cost, reason, queue_waits_s):
        pass

    def on_settled(self, outcome, latencies_s, failed):
        if latencies_s and not FirstAnswer.seen:
            FirstAnswer.seen = True
            sys.stdout.write("\\nFIRST-ANSWER\\n")
            sys.stdout.flush()


def observed(engine, settings):
    batcher = make_batcher(engine, settings)
    batcher.add_observer(FirstAnswer())
    return batcher


LLMReplica(observed).install()
from flyteplugins_batcher.cli import main

sys.argv = ["flyteplugins-batcher", *sys.argv[1:]]
main()
"""

ONE_AT_A_TIME = json.dumps({"time_scale": 1, "gpu": {"max_num_seqs": 1}, "output_lengths": {"mean": 150}})
"""The simulated GPU runs one sequence at a time, about a second each: 24 answers come over half a minute."""


def _read_terminal(args: list[str], cwd: Path, timeout_s: float) -> tuple[list[tuple[float, str]], int]:
    """Run `python -c LAUNCH args` on a pseudo-terminal: each line or rewrite (split at \\r, \\n) stamped on arrival."""
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "COLUMNS": "300"}
    process = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *args],
        stdout=follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=env,
    )
    os.close(follower)
    pieces: list[tuple[float, str]] = []
    pending, deadline = "", time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(leader, 65536).decode(errors="replace")
            except OSError:  # the run closed the terminal
                break
            now = time.monotonic()
            *complete, pending = re.split(r"[\r\n]", pending + data)
            pieces.extend((now, text) for text in complete if text.strip())
    finally:
        if process.poll() is None:
            process.kill()
        os.close(leader)
    return pieces, process.wait()


def _first_stamp(pieces: list[tuple[float, str]], pattern: str) -> float:
    stamps = [stamp for stamp, text in pieces if re.search(pattern, text)]
    assert stamps, f"nothing matched {pattern!r} in: {[text for _, text in pieces][-20:]}"
    return stamps[0]


def test_the_first_progress_line_comes_within_seconds_of_the_first_answer(tmp_path: Path) -> None:
    args = ["gsm8k", "--num-questions", str(QUESTIONS), "--source", "sample", "--chunk-size", str(QUESTIONS)]
    args += ["--engine", "simulated", "--engine-args", ONE_AT_A_TIME, "--no-resume", "-o", str(tmp_path / "out")]
    pieces, status = _read_terminal(args, tmp_path, timeout_s=300)

    assert status == 0, [text for _, text in pieces][-20:]
    first_answer = _first_stamp(pieces, r"^FIRST-ANSWER$")
    first_line = _first_stamp(pieces, r"progress: [1-9]\d*/24 questions")
    last_answer = _first_stamp(pieces, r"progress: 24/24 questions")
    assert last_answer - first_answer > 2 * FIRST_LINE_WITHIN_S  # a line per chunk would come far too late
    assert first_line - first_answer < FIRST_LINE_WITHIN_S
    moving = {text.split(" questions")[0] for stamp, text in pieces if first_answer <= stamp < last_answer}
    assert len(moving) >= 5, f"the line moved only through {sorted(moving)}"  # it moves as answers come
    rates = [text for _, text in pieces if re.search(r"questions/s, [\d.]+ output tokens/s \| ETA \d", text)]
    assert rates, "no line showed a rate, output tokens/s and an ETA"


@pytest.mark.slow
def test_on_the_transformers_engine_too(tmp_path: Path) -> None:
    """`make run`'s engine and model (SmolLM2 on CPU), one question per batch: the line shows the first answers
    within seconds of the first, with a rate and an ETA, however long the rest of the chunk takes."""
    args = ["gsm8k", "--num-questions", "6", "--source", "sample", "--chunk-size", "6", "--max-batch-size", "1"]
    args += ["--engine", "transformers", "--max-new-tokens", "24", "--no-resume", "-o", str(tmp_path / "out")]
    pieces, status = _read_terminal(args, tmp_path, timeout_s=900)

    assert status == 0, [text for _, text in pieces][-20:]
    first_answer = _first_stamp(pieces, r"^FIRST-ANSWER$")
    assert _first_stamp(pieces, r"progress: [1-9]/6 questions") - first_answer < FIRST_LINE_WITHIN_S
    assert any(re.search(r"output tokens/s \| (ETA \d|done)", text) for _, text in pieces)
