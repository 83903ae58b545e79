"""`flyteplugins-batcher run-batch` against `vllm run-batch` on one file: the wall time a user waits, loading included.

Both commands get the same OpenAI batch file (gsm8k questions as chat lines, `max_tokens` and
greedy decoding in each body), the same model and the same engine arguments, and run as a user
runs them, one process each from start to exit:

- **vllm run-batch**: `python -m vllm.entrypoints.openai.run_batch -i FILE -o OUT --model M ...`
  (the CPU build's `vllm` console script cannot find its own package metadata);
- **ours**: `python -m flyteplugins_batcher run-batch -i FILE -o DIR --model M --engine vllm ...`,
  the package's JSONL job through flyte's local runner, with its progress line, report and resume
  cache (`--no-resume`, so that every round computes every line).

Rounds alternate (vLLM first, then ours, then vLLM again, ...) so that a machine's drift reaches both;
the table gives each way's median, and ours over vLLM's. Answers are compared line by line (greedy:
the two should agree, but vLLM promises no batch-invariant numerics).

    python benchmarks/bench_run_batch.py                       # 256 lines of 64 tokens, 2 rounds, SmolLM2 on CPU
    python benchmarks/bench_run_batch.py --lines 32 --rounds 1 # a quick run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._contenders import (
    batch_answers,
    chat_line,
    fresh_folder,
    ours_on_vllm,
    run_command,
    vllm_engine_flags,
    vllm_run_batch,
)
from benchmarks._harness import GSM8K, VLLM_ENGINE, benchmark_parser, gsm8k_questions, medians_by
from benchmarks._tables import markdown_table
from flyteplugins_batcher.engines import bundled_smollm2_path
from flyteplugins_batcher.engines._smollm2 import BUNDLED_MODEL_NAME

WAYS = ("vllm run-batch", "ours")


@dataclass(frozen=True)
class Run:
    """One command's run: its way, wall time, and the answers it wrote by custom_id."""

    way: str
    wall_s: float
    answers: dict[str, str]
    output_tokens: int


def write_requests(data: Path, count: int, max_tokens: int, model: str, target: Path) -> int:
    """Chat lines for the first `count` questions of a gsm8k JSONL file (repeated if it has fewer)."""
    questions = gsm8k_questions(data, count)
    with target.open("w") as lines:
        for number, text in enumerate(questions):
            lines.write(chat_line(f"q{number}", [{"role": "user", "content": text}], model, max_tokens) + "\n")
    return count


def command(way: str, args: argparse.Namespace, requests: Path, out: Path) -> list[str]:
    if way == "vllm run-batch":
        return vllm_run_batch(requests, out / "results.jsonl", args)
    return ours_on_vllm(args, "run-batch", "-i", str(requests), "-o", str(out))


def run_once(way: str, args: argparse.Namespace, requests: Path, scratch: Path) -> Run:
    """Run one command to its exit and read what it wrote."""
    out = fresh_folder(scratch)
    finished = run_command(command(way, args, requests, out), scratch)
    if finished.returncode != 0:
        raise SystemExit(finished.failure(way))
    answers, tokens = batch_answers(out / "results.jsonl")
    print(f"{way}: {finished.exit_s:.1f} s, {len(answers)} answers, {tokens} output tokens", flush=True)
    return Run(way, finished.exit_s, answers, tokens)


def table(runs: list[Run], lines: int) -> tuple[str, float]:
    """The table of medians per way, and ours over vLLM's median wall time."""
    median = _medians(runs)
    reference = next(run for run in runs if run.way == WAYS[0])
    rows = []
    for way in WAYS:
        runs_of_way = [run for run in runs if run.way == way]
        agree = sum(run.answers.get(key) == text for run in runs_of_way for key, text in reference.answers.items()) / (
            len(runs_of_way) * len(reference.answers)
        )
        rounds = " / ".join(f"{run.wall_s:.1f}" for run in runs_of_way)
        tokens = statistics.median(run.output_tokens for run in runs_of_way)
        rows.append([way, f"{len(runs_of_way[0].answers)}/{lines}", median[way], rounds, tokens, f"{agree:.0%}"])
    ratio = median["ours"] / median[WAYS[0]]
    headers = ["way", "answered", "median wall s", "rounds (s)", "output tokens", "answers = vLLM's 1st"]
    return markdown_table(headers, rows), ratio


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(__doc__, data=GSM8K, rounds=2, **VLLM_ENGINE)
    parser.add_argument("--lines", type=int, default=256, help="chat lines in the file")
    parser.add_argument("--max-tokens", type=int, default=64, help="each line's max_tokens")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    label = Path(args.model).name if args.model else BUNDLED_MODEL_NAME
    args.model = args.model or str(bundled_smollm2_path())
    with tempfile.TemporaryDirectory(prefix="bench-run-batch-") as folder:
        scratch = Path(folder)
        requests = scratch / "requests.jsonl"
        lines = write_requests(args.data, args.lines, args.max_tokens, args.model, requests)
        runs = [run_once(way, args, requests, scratch) for _ in range(args.rounds) for way in WAYS]
    rendered, ratio = table(runs, lines)
    print(
        f"\n{lines} gsm8k chat lines of at most {args.max_tokens} tokens, greedy; model {label}; "
        f"engine: {' '.join(vllm_engine_flags(args))}, KV cache {args.kv_cache_gb:g} GiB; wall time per command, "
        f"loading included; medians of {args.rounds} alternating rounds\n"
    )
    print(rendered)
    print(f"\nours / vllm run-batch (median wall time): {ratio:.2f}x (below 1: ours is faster)")
    write_chart_data(
        args.chart_data,
        title=f"run-batch: {lines} chat lines, wall time with loading",
        unit="seconds per command, lower is better",
        rows=list(_medians(runs).items()),
        note=f"{label}, vLLM's CPU build, {args.dtype}; medians of {args.rounds} alternating rounds",
        digits=1,
    )


def _medians(runs: list[Run]) -> dict[str, float]:
    return medians_by(runs, lambda run: run.way, lambda run: run.wall_s)


if __name__ == "__main__":
    main()
