"""Shared prefixes computed once: run-batch with prefix-aware placement beside file order, vLLM's and Ray's programs.

Three workloads, each an OpenAI batch file of chat lines that every contender reads:

- **documents**: `--documents` documents of about 550 tokens (gsm8k questions run together), each
  asked `--questions` questions, listed question by question (a document's questions lie
  `--documents` lines apart), with a KV cache too small to hold every document at once;
- **few-shot**: one long prefix (8 worked gsm8k examples, about 1,100 tokens) before each of
  `--few-shot-lines` gsm8k questions;
- **plain**: `--plain-lines` gsm8k questions with the gsm8k system prompt: nothing shared beyond it.

With `--simulated`, the documents workload instead runs on R = 1, 2, 4, 8 replica processes of the
GPU-timed simulated engine, through the real driver (`_prefix_simulated.py`): prefill tokens
computed in "prefix" and "file" order against the ideal (each document computed once).

Contenders, each a fresh process timed whole as a user waits (loading included), with the same
model (the bundled SmolLM2 unless `--model`), the same engine arguments and prefix caching on:
`ours, prefix` (`run-batch`, placement on: the default), `ours, file` (`run-batch --order file`),
`vllm run-batch`, `LLM.chat` (vLLM's offline `LLM.chat` over every line at once) and
`Ray Data LLM` (its vLLM processor, in its own virtualenv: `make ray-env`). Rounds alternate the
order. Printed per workload: each contender's median seconds and rounds, the prompt tokens vLLM
found in its cache where the contender says (ours: `cached_tokens` in each answer's usage), and
how many answers equal `ours, file`'s.

    python benchmarks/bench_prefix.py                                   # the three workloads, 1 round
    python benchmarks/bench_prefix.py --simulated                       # documents on 1-8 simulated GPUs
    python benchmarks/bench_prefix.py --workloads documents --documents 8 --questions 4 --ways "ours, prefix,ours, file"
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

from benchmarks import bench_table
from benchmarks._charts import write_chart_data
from benchmarks._contenders import batch_bodies, chat_line, fresh_folder, run_command
from benchmarks._harness import GSM8K, VLLM_ENGINE, benchmark_parser, gsm8k_rows, medians_by, round_order
from benchmarks._tables import markdown_table
from flyteplugins_batcher.engines import bundled_smollm2_path
from flyteplugins_batcher.jobs._gsm8k import SYSTEM_PROMPT

WAYS = ("ours, prefix", "ours, file", "vllm run-batch", "LLM.chat", "Ray Data LLM")
WORKLOADS = ("documents", "few-shot", "plain")
DOCUMENT_SYSTEM = "Answer the question about the document in one short sentence."
GOALS = (
    ("documents", "ours, prefix", "vllm run-batch", 0.5),
    ("documents", "ours, prefix", "ours, file", 0.6),
    ("few-shot", "ours, prefix", "vllm run-batch", 1.0),
    ("plain", "ours, prefix", "vllm run-batch", 1.0),
    ("documents", "ours, prefix", "Ray Data LLM", 1.0),
    ("few-shot", "ours, prefix", "Ray Data LLM", 1.0),
    ("plain", "ours, prefix", "Ray Data LLM", 1.0),
)
"""(workload, contender, reference, most the contender's median may take of the reference's): issue 40's goals."""


@dataclass(frozen=True)
class Result:
    """One contender's run on one workload: seconds until its answers were written, its answers, cached tokens."""

    workload: str
    way: str
    round: int
    seconds: float
    answers: dict[str, str]
    cached_tokens: int | None


def documents_lines(rows: list[dict[str, str]], args: argparse.Namespace) -> list[str]:
    """Each document asked each question, question by question: a document's questions `--documents` lines apart."""
    documents = [
        f"Document {number}. " + " ".join(rows[(number * 8 + line) % len(rows)]["question"] for line in range(8))
        for number in range(args.documents)
    ]  # each begins with its own number: documents that repeat gsm8k's text still share nothing
    lines = []
    for asked in range(args.questions):
        for number, document in enumerate(documents):
            question = f"How many numbers does sentence {asked + 1} of the document mention?"
            messages = [
                {"role": "system", "content": DOCUMENT_SYSTEM},
                {"role": "user", "content": f"Document:\n{document}\n\nQuestion: {question}"},
            ]
            lines.append(chat_line(f"doc{number}-q{asked}", messages, args.model, args.max_tokens))
    return lines


def few_shot_lines(rows: list[dict[str, str]], args: argparse.Namespace) -> list[str]:
    """Eight worked examples, then the question: one long prefix on every line."""
    examples = "\n\n".join(f"Question: {row['question']}\nAnswer: {row['answer']}" for row in rows[-8:])
    system = f"{SYSTEM_PROMPT}\n\nWorked examples:\n\n{examples}"
    return system_and_question_lines(system, rows[: args.few_shot_lines], args)


def plain_lines(rows: list[dict[str, str]], args: argparse.Namespace) -> list[str]:
    return system_and_question_lines(SYSTEM_PROMPT, rows[: args.plain_lines], args)


def system_and_question_lines(system: str, rows: list[dict[str, str]], args: argparse.Namespace) -> list[str]:
    """A line `q<n>` per row: the system prompt, then the row's question."""
    lines = []
    for number, row in enumerate(rows):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": row["question"]}]
        lines.append(chat_line(f"q{number}", messages, args.model, args.max_tokens))
    return lines


MAKERS = {"documents": documents_lines, "few-shot": few_shot_lines, "plain": plain_lines}


def command(way: str, args: argparse.Namespace, inputs: bench_table.Inputs, out: Path) -> list[str]:
    """A contender's command line: bench_table's, with prefix caching on and our placement chosen."""
    if way.startswith("ours"):
        line = bench_table.command("run-batch", args, inputs, out)
        return [
            *line,
            "--order",
            way.removeprefix("ours, "),
            "--engine-args",
            json.dumps({"enable_prefix_caching": True}),
        ]
    line = bench_table.command(way, args, inputs, out)
    return [*line, "--enable-prefix-caching"] if way == "vllm run-batch" else line


def as_table_way(way: str) -> str:
    """The name bench_table knows the contender by (ours are its `run-batch`)."""
    return "run-batch" if way.startswith("ours") else way


def cached_tokens(way: str, out: Path) -> int | None:
    """The prompt tokens the contender's answers say vLLM found cached (None: it does not say)."""
    if as_table_way(way) not in ("run-batch", "vllm run-batch"):
        return None
    bodies = batch_bodies(out / "results.jsonl").values()
    details = [(body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") for body in bodies]
    return None if not details or any(value is None for value in details) else sum(details)


def run_once(
    workload: str, way: str, number: int, args: argparse.Namespace, inputs: bench_table.Inputs
) -> Result | None:
    """One contender on one workload, a fresh process timed whole; None (its error shown) if it failed."""
    out = fresh_folder(inputs.scratch)
    finished = run_command(command(way, args, inputs, out), inputs.scratch)
    if finished.returncode != 0:
        print(finished.failure(f"{workload}, round {number + 1}, {way}"), flush=True)
        return None
    answers, _ = bench_table.read_answers(as_table_way(way), out)
    cached = cached_tokens(way, out)
    said = f"{finished.seconds:.1f} s, {len(answers)} answers, cached {cached}"
    print(f"{workload}, round {number + 1}, {way}: {said}", flush=True)
    return Result(workload, way, number, finished.seconds, answers, cached)


def medians(results: list[Result]) -> dict[tuple[str, str], float]:
    return medians_by(results, lambda result: (result.workload, result.way), lambda result: result.seconds)


def contenders_table(results: list[Result], lines: dict[str, int]) -> str:
    median = medians(results)
    rows = []
    for workload, way in median:
        mine = [result for result in results if (result.workload, result.way) == (workload, way)]
        base = next((r for r in results if (r.workload, r.way) == (workload, "ours, file")), None)
        same = (
            "-"
            if base is None
            else f"{sum(mine[0].answers.get(k) == v for k, v in base.answers.items())}/{len(base.answers)}"
        )
        rounds = " / ".join(f"{result.seconds:.1f}" for result in mine)
        cached = "" if mine[0].cached_tokens is None else f"{mine[0].cached_tokens:,}"
        rows.append(
            [
                workload,
                way,
                f"{len(mine[0].answers)}/{lines[workload]}",
                f"{median[workload, way]:.1f}",
                rounds,
                cached,
                same,
            ]
        )
    headers = ["workload", "contender", "answered", "median s", "rounds (s)", "cached prompt tokens", "= ours, file"]
    return markdown_table(headers, rows)


def goals_table(results: list[Result]) -> str:
    median = medians(results)
    rows = []
    for workload, way, reference, limit in GOALS:
        if (workload, way) in median and (workload, reference) in median:
            ratio = median[workload, way] / median[workload, reference]
            rows.append(
                [
                    workload,
                    f"{way} / {reference}",
                    f"{ratio:.2f}x",
                    f"{limit:.2f}x",
                    "met" if ratio <= limit else "not met",
                ]
            )
    return markdown_table(["workload", "goal", "ratio of medians", "at most", ""], rows)


def parse_args() -> argparse.Namespace:
    vllm = {**VLLM_ENGINE, "kv_cache_gb": 0.25}  # about 5,800 tokens: fewer than the documents
    parser = benchmark_parser(__doc__, data=GSM8K, rounds=1, time_scale=20.0, **vllm)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--ways", default="|".join(WAYS), help="the contenders, separated by |")
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--few-shot-lines", type=int, default=128)
    parser.add_argument("--plain-lines", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--ray-python", type=Path, default=bench_table.RAY_PYTHON)
    parser.add_argument("--simulated", action="store_true", help="the documents on 1-8 simulated GPUs instead")
    parser.add_argument("--sim-documents", type=int, default=2048)
    parser.add_argument("--sim-replicas", default="1,2,4,8")
    parser.add_argument("--sim-kv-cache-tokens", type=int, default=442_368, help="each simulated GPU's KV cache")
    args = parser.parse_args()
    args.sim_replicas = [int(value) for value in args.sim_replicas.split(",")]
    args.ways = tuple(way.strip() for way in args.ways.split("|"))
    args.workloads = tuple(name.strip() for name in args.workloads.split(","))
    if set(args.ways) - set(WAYS) or set(args.workloads) - set(WORKLOADS):
        parser.error(f"contenders among {WAYS}, workloads among {WORKLOADS}")
    args.ray_python = args.ray_python.absolute()  # the contenders run in a scratch folder
    if "Ray Data LLM" in args.ways and not args.ray_python.exists():
        print(f"no {args.ray_python}: Ray Data LLM is left out (make ray-env)", file=sys.stderr)
        args.ways = tuple(way for way in args.ways if way != "Ray Data LLM")
    return args


def simulated(args: argparse.Namespace) -> None:
    """The documents workload on 1-8 simulated GPUs: prefill computed by order, against the ideal."""
    from benchmarks import _prefix_simulated

    args.documents, args.model = args.sim_documents, "simulated"
    with tempfile.TemporaryDirectory(prefix="bench-prefix-sim-") as folder:
        path = Path(folder) / "documents.jsonl"
        path.write_text("\n".join(documents_lines(gsm8k_rows(args.data), args)) + "\n")
        ideal, runs = _prefix_simulated.measure(path, args)
    rows = [
        [run["replicas"], run["order"], f"{run['prompt']:,}", f"{run['prefill']:,}", f"{run['prefill'] / ideal:.2f}x",
         f"{run['wall_s']:.1f}"]
        for run in runs
    ]  # fmt: skip
    print(f"\n{args.documents} documents x {args.questions} questions, listed question by question, on simulated "
          f"H100s (KV cache {args.sim_kv_cache_tokens:,} tokens each); ideal prefill {ideal:,} tokens\n")  # fmt: skip
    print(markdown_table(["replicas", "order", "prompt tokens", "prefill computed", "x ideal", "wall s"], rows))


def main() -> None:
    args = parse_args()
    if args.simulated:
        simulated(args)
        return
    args.model = args.model or str(bundled_smollm2_path())
    rows = gsm8k_rows(args.data)
    results: list[Result] = []
    lines: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-prefix-") as folder:
        for workload in args.workloads:
            made = MAKERS[workload](rows, args)
            lines[workload] = len(made)
            inputs = bench_table.Inputs(
                Path(folder) / "unused.parquet", Path(folder) / f"{workload}.jsonl", Path(folder)
            )
            inputs.jsonl.write_text("\n".join(made) + "\n")
            for number in range(args.rounds):
                for way in round_order(number, args.ways):
                    result = run_once(workload, way, number, args, inputs)
                    results += [result] if result is not None else []
    print(
        f"\nSmolLM2 on vLLM's CPU build, {args.dtype}, KV cache {args.kv_cache_gb:g} GiB, prefix caching on, "
        f"at most {args.max_tokens} new tokens; seconds until the answers are written, loading included\n"
    )
    print(contenders_table(results, lines))
    print()
    print(goals_table(results))
    write_chart_data(
        args.chart_data,
        title="Shared prefixes: wall time by workload and contender, loading included",
        unit="seconds until the answers are written, lower is better",
        rows=[(f"{workload}: {way}", seconds) for (workload, way), seconds in medians(results).items()],
        note=f"SmolLM2, vLLM's CPU build, KV cache {args.kv_cache_gb:g} GiB, prefix caching on "
        "(benchmarks/bench_prefix.py)",
        digits=1,
    )


if __name__ == "__main__":
    main()
