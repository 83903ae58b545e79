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
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks._charts import add_chart_flag, write_chart_data  # noqa: E402
from benchmarks._tables import markdown_table  # noqa: E402
from flyteplugins_batcher.engines import bundled_smollm2_path  # noqa: E402
from flyteplugins_batcher.engines._smollm2 import BUNDLED_MODEL_NAME  # noqa: E402

DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
SAMPLE_DATA = REPO_ROOT / "flyteplugins_batcher" / "jobs" / "data" / "gsm8k_sample.jsonl"
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
    questions = [json.loads(line)["question"] for line in data.read_text().splitlines() if line.strip()]
    with target.open("w") as lines:
        for number in range(count):
            body = {
                "model": model,
                "messages": [{"role": "user", "content": questions[number % len(questions)]}],
                "max_tokens": max_tokens,
                "temperature": 0,
            }
            request = {"custom_id": f"q{number}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            lines.write(json.dumps(request) + "\n")
    return count


def engine_flags(args: argparse.Namespace) -> list[str]:
    """The engine arguments both commands take, in vLLM's spelling."""
    flags = [
        "--dtype",
        args.dtype,
        "--max-model-len",
        str(args.max_model_len),
        "--max-num-seqs",
        str(args.max_num_seqs),
    ]
    return [*flags, "--enforce-eager"] if args.enforce_eager else flags


def command(way: str, args: argparse.Namespace, requests: Path, out: Path) -> list[str]:
    if way == "vllm run-batch":
        kv_cache = ["--kv-cache-memory-bytes", str(int(args.kv_cache_gb * 2**30))]
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(requests), "-o",
            str(out / "results.jsonl"), "--model", args.model, *engine_flags(args), *kv_cache,
        ]  # fmt: skip
    return [
        sys.executable, "-m", "flyteplugins_batcher", "run-batch", "-i", str(requests), "-o", str(out),
        "--model", args.model, "--engine", "vllm", "--kv-cache-gb", str(args.kv_cache_gb), "--no-resume",
        *engine_flags(args),
    ]  # fmt: skip


def run_once(way: str, args: argparse.Namespace, requests: Path, scratch: Path) -> Run:
    """Run one command to its exit and read what it wrote."""
    out = Path(tempfile.mkdtemp(dir=scratch))
    started = time.perf_counter()
    finished = subprocess.run(command(way, args, requests, out), capture_output=True, text=True, cwd=scratch)
    wall = time.perf_counter() - started
    if finished.returncode != 0:
        raise SystemExit(f"{way} failed ({finished.returncode}):\n{finished.stderr[-4000:]}")
    answers, tokens = {}, 0
    for line in (out / "results.jsonl").read_text().splitlines():
        result = json.loads(line)
        body = result["response"]["body"]
        answers[result["custom_id"]] = body["choices"][0]["message"]["content"]
        tokens += body["usage"]["completion_tokens"]
    print(f"{way}: {wall:.1f} s, {len(answers)} answers, {tokens} output tokens", flush=True)
    return Run(way, wall, answers, tokens)


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA if DEFAULT_DATA.exists() else SAMPLE_DATA)
    parser.add_argument("--lines", type=int, default=256, help="chat lines in the file")
    parser.add_argument("--max-tokens", type=int, default=64, help="each line's max_tokens")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each way, alternating")
    parser.add_argument("--model", default="", help=f"hub id or path (default: the bundled {BUNDLED_MODEL_NAME})")
    parser.add_argument("--dtype", default="float32", help="float32: bf16 is emulated on AVX2-only CPUs")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--kv-cache-gb", type=float, default=2.0)
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    add_chart_flag(parser)
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
        f"engine: {' '.join(engine_flags(args))}, KV cache {args.kv_cache_gb:g} GiB; wall time per command, "
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
    return {way: statistics.median(run.wall_s for run in runs if run.way == way) for way in WAYS}


if __name__ == "__main__":
    main()
