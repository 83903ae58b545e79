"""Contenders that are whole commands: our CLI beside vLLM's, each a fresh process timed as a user waits.

`bench_run_batch.py`, `bench_table.py`, `bench_prefix.py` and `bench_models.py` write one OpenAI
batch file (`chat_line`), give every contender the same engine flags (`vllm_engine_flags`, from the
flags `_harness.VLLM_ENGINE` adds), run each command to its exit (`run_command`) and read the
answers it wrote (`batch_answers`).

    out = fresh_folder(scratch)
    run = run_command(ours_on_vllm(args, "run-batch", "-i", str(requests), "-o", str(out)), scratch)
    answers, tokens = batch_answers(out / "results.jsonl")
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


def chat_line(custom_id: str, messages: list[dict[str, str]], model: str, max_tokens: int) -> str:
    """One line of an OpenAI batch file: a greedy chat request with at most `max_tokens` new tokens."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def vllm_engine_flags(args: argparse.Namespace) -> list[str]:
    """The engine arguments every contender takes, in vLLM's spelling (the KV cache's size apart)."""
    flags = ["--dtype", args.dtype, "--max-model-len", str(args.max_model_len)]
    flags += ["--max-num-seqs", str(args.max_num_seqs)]
    return [*flags, "--enforce-eager"] if args.enforce_eager else [*flags, "--no-enforce-eager"]


def ours_on_vllm(args: argparse.Namespace, subcommand: str, *arguments: str, models: tuple[str, ...] = ()) -> list[str]:
    """`python -m flyteplugins_batcher SUBCOMMAND ARGUMENTS...` on vLLM, with this interpreter.

    Then the models (`args.model` unless given), the KV cache, no resume, and the engine flags.
    """
    named = [flag for model in (models or (args.model,)) for flag in ("--model", model)]
    ours = [sys.executable, "-m", "flyteplugins_batcher", subcommand, *arguments, *named, "--engine", "vllm"]
    return [*ours, "--kv-cache-gb", str(args.kv_cache_gb), "--no-resume", *vllm_engine_flags(args)]


def vllm_run_batch(requests: Path, results: Path, args: argparse.Namespace) -> list[str]:
    """`vllm run-batch` (its module: the CPU build's console script cannot find its own package metadata)."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(requests), "-o", str(results)]
    kv_bytes = ["--kv-cache-memory-bytes", str(int(args.kv_cache_gb * 2**30))]
    return [*command, "--model", args.model, *vllm_engine_flags(args), *kv_bytes]


def fresh_folder(scratch: Path) -> Path:
    """A new empty folder under `scratch`, for one run's output."""
    return Path(tempfile.mkdtemp(dir=scratch))


@dataclass(frozen=True)
class CommandRun:
    """A command run to its exit: what it printed, its wall time, and when it said its answers were written.

    Attributes:
        returncode: Its exit status.
        stdout: What it printed.
        stderr: What it printed on stderr.
        exit_s: Seconds from its start to its exit.
        seconds: Seconds from its start until its answers were written, where it says (its last
            `phases: {...}` line on stderr has `written_at`, a wall-clock time), else `exit_s`.
        phases: That line's other marks, by name.
    """

    returncode: int
    stdout: str
    stderr: str
    exit_s: float
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)

    def failure(self, what: str) -> str:
        """`what failed (status):` and the ends of what it printed."""
        return f"{what} failed ({self.returncode}):\n{self.stdout[-2000:]}{self.stderr[-4000:]}"


def run_command(command: list[str], cwd: Path, env: Mapping[str, str] | None = None) -> CommandRun:
    """Run `command` in `cwd` (with `env` added to this process's environment) to its exit, timed as a user waits."""
    launched, started = time.time(), time.perf_counter()
    environment = {**os.environ, **env} if env else None
    finished = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=environment)
    exit_s = time.perf_counter() - started
    marks = [line for line in finished.stderr.splitlines() if line.startswith("phases: ")]
    phases = json.loads(marks[-1].removeprefix("phases: ")) if marks else {}
    seconds = phases.pop("written_at") - launched if "written_at" in phases else exit_s
    return CommandRun(finished.returncode, finished.stdout, finished.stderr, exit_s, seconds, phases)


def batch_bodies(results: Path) -> dict[str, dict]:
    """The response bodies of a batch's result file by custom_id (its answered lines: vLLM writes a failed line's
    error beside a response whose body is null)."""
    lines = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {line["custom_id"]: line["response"]["body"] for line in lines if (line.get("response") or {}).get("body")}


def batch_answers(results: Path) -> tuple[dict[str, str], int]:
    """The chat answers of a batch's result file by custom_id, and their output tokens."""
    bodies = batch_bodies(results)
    tokens = sum(body["usage"]["completion_tokens"] for body in bodies.values())
    return {key: body["choices"][0]["message"]["content"] for key, body in bodies.items()}, tokens
