"""The table job beside run-batch, `vllm run-batch`, vLLM's own `LLM.chat` and Ray Data LLM: wall time as a user waits.

The same gsm8k questions (the project's gsm8k system prompt, greedy, `max_tokens` 64 by default),
the same model (the bundled SmolLM2 unless `--model`) and the same engine arguments (`--dtype`,
`--max-model-len`, `--max-num-seqs`, the KV cache's size, `--enforce-eager`) go to five programs,
each run as a user runs it, one fresh process from start to exit:

- **table job**: `python -m flyteplugins_batcher run-table -i q.parquet -o OUT --prompt "{question}"
  --system-prompt ... --max-new-tokens N --engine vllm ... --no-resume` on the questions as Parquet;
  answers are row n of `pyarrow.parquet.read_table(OUT)`, column `generated_text`;
- **run-batch**: `python -m flyteplugins_batcher run-batch -i q.jsonl -o DIR --engine vllm ... --no-resume`
  on the same questions as OpenAI batch chat lines (system and user message, `max_tokens`, `temperature` 0);
- **vllm run-batch**: `python -m vllm.entrypoints.openai.run_batch -i q.jsonl -o results.jsonl ...`;
- **LLM.chat**: `benchmarks/_vllm_chat.py`, vLLM's offline `LLM.chat` over every line at once in one
  process: the limit (imports, engine start and inference, timed until its answers are written);
- **Ray Data LLM**: `benchmarks/_ray_data_llm.py` in its own virtualenv (`--ray-python`), Ray Data
  LLM's vLLM processor over the same lines (timed until its answers are written, Ray's start and
  the model's loading included).

The two scripts report when their answers were written; their time is that (their exit, after
vLLM's or Ray's shutdown, is shown beside it). The commands' time is their exit. Rounds alternate
the order (forward, then backward, ...) so that the machine's drift reaches every contender.
Printed: each contender's median and rounds, the goals' ratios of medians (met or not; a
benchmark measures, it does not fail), and how many answers are identical.

    python benchmarks/bench_table.py                        # 256 questions of 64 tokens, 2 rounds
    python benchmarks/bench_table.py --lines 16 --rounds 1  # a quick run
    python benchmarks/bench_table.py --ways "table job,run-batch"
"""

from __future__ import annotations

import argparse
import json
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
from benchmarks._harness import (
    GSM8K,
    REPO_ROOT,
    VLLM_ENGINE,
    benchmark_parser,
    gsm8k_questions,
    medians_by,
    round_order,
)
from benchmarks._tables import markdown_table
from flyteplugins_batcher.engines import bundled_smollm2_path
from flyteplugins_batcher.engines._smollm2 import BUNDLED_MODEL_NAME
from flyteplugins_batcher.jobs._gsm8k import SYSTEM_PROMPT

RAY_PYTHON = REPO_ROOT / ".venv-ray" / "bin" / "python"  # made by `make ray-env`
WAYS = ("table job", "run-batch", "vllm run-batch", "LLM.chat", "Ray Data LLM")
GOALS = (
    ("table job", "run-batch", 1.02, "the table layer costs nothing"),
    ("table job", "LLM.chat", 1.05, "near vLLM's own offline limit"),
    ("run-batch", "vllm run-batch", 1.00, "no slower than vLLM's command"),
    ("table job", "Ray Data LLM", 0.90, "faster than Ray Data LLM"),
    ("run-batch", "Ray Data LLM", 0.90, "faster than Ray Data LLM"),
)
"""(contender, reference, most the contender's median may take of the reference's, what it means)."""


@dataclass(frozen=True)
class Run:
    """One contender's run: its time until the answers were there, its exit, and its answers by custom_id."""

    way: str
    round: int
    seconds: float
    exit_s: float
    answers: dict[str, str]
    output_tokens: int


@dataclass(frozen=True)
class Inputs:
    """The files every contender reads: the questions as Parquet and as batch lines, and the scratch folder."""

    parquet: Path
    jsonl: Path
    scratch: Path


def write_inputs(texts: list[str], args: argparse.Namespace, scratch: Path) -> Inputs:
    """The questions as a Parquet table (`question`) and as chat lines with the gsm8k system prompt."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    inputs = Inputs(scratch / "q.parquet", scratch / "q.jsonl", scratch)
    pq.write_table(pa.table({"question": texts}), inputs.parquet)
    with inputs.jsonl.open("w") as lines:
        for number, text in enumerate(texts):
            messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
            lines.write(chat_line(f"q{number}", messages, args.model, args.max_tokens) + "\n")
    return inputs


def command(way: str, args: argparse.Namespace, inputs: Inputs, out: Path) -> list[str]:
    """The command line of one contender, writing under `out`."""
    if way == "table job":
        table = ["-i", str(inputs.parquet), "-o", str(out / "table"), "--prompt", "{question}"]
        generation = ["--system-prompt", SYSTEM_PROMPT, "--max-new-tokens", str(args.max_tokens), "--temperature", "0"]
        return ours_on_vllm(args, "run-table", *table, *generation)
    if way == "run-batch":
        return ours_on_vllm(args, "run-batch", "-i", str(inputs.jsonl), "-o", str(out))
    if way == "vllm run-batch":
        return vllm_run_batch(inputs.jsonl, out / "results.jsonl", args)
    script = [sys.executable, str(REPO_ROOT / "benchmarks" / "_vllm_chat.py")]
    if way == "Ray Data LLM":
        script = [str(args.ray_python), str(REPO_ROOT / "benchmarks" / "_ray_data_llm.py")]
    io = ["-i", str(inputs.jsonl), "-o", str(out / "answers.jsonl"), "--model", args.model]
    return [*script, *io, *vllm_engine_flags(args), "--kv-cache-gb", str(args.kv_cache_gb)]


def read_answers(way: str, out: Path) -> tuple[dict[str, str], int]:
    """What a contender wrote: its answers by custom_id, and their output tokens."""
    if way == "table job":
        import pyarrow.parquet as pq

        table = pq.read_table(out / "table").to_pydict()
        answers = {f"q{number}": text for number, text in enumerate(table["generated_text"]) if text is not None}
        return answers, sum(tokens or 0 for tokens in table["num_generated_tokens"])
    if way not in WAYS[3:]:
        return batch_answers(out / "results.jsonl")
    answered = [line for line in map(json.loads, (out / "answers.jsonl").open()) if "content" in line]
    tokens = sum(line["completion_tokens"] for line in answered)
    return {line["custom_id"]: line["content"] for line in answered}, tokens


def run_once(way: str, number: int, args: argparse.Namespace, inputs: Inputs) -> Run | None:
    """Run one contender to its exit and read what it wrote (None, its error shown, if it failed)."""
    out = fresh_folder(inputs.scratch)
    finished = run_command(command(way, args, inputs, out), inputs.scratch)
    if finished.returncode != 0:
        print(finished.failure(f"round {number + 1}, {way}"), flush=True)
        return None
    answers, tokens = read_answers(way, out)
    timing = f"{finished.seconds:.1f} s (exit {finished.exit_s:.1f} s)"
    said = f"{len(answers)} answers, {tokens} output tokens {finished.phases or ''}"
    print(f"round {number + 1}, {way}: {timing}, {said}", flush=True)
    return Run(way, number, finished.seconds, finished.exit_s, answers, tokens)


def medians(runs: list[Run]) -> dict[str, float]:
    return medians_by(runs, lambda run: run.way, lambda run: run.seconds)


def agreement(runs: list[Run], way: str, reference: str) -> str:
    """How many of `way`'s answers equal `reference`'s first run's, over all its runs."""
    base = next((run for run in runs if run.way == reference), None)
    if base is None:
        return "-"
    mine = [run for run in runs if run.way == way]
    same = sum(run.answers.get(key) == text for run in mine for key, text in base.answers.items())
    return f"{same}/{len(mine) * len(base.answers)}"


def contenders_table(runs: list[Run], lines: int) -> str:
    """Each contender's median, rounds, exit, tokens and answers identical to the others'."""
    median = medians(runs)
    references = [way for way in ("run-batch", "vllm run-batch", "LLM.chat") if way in median]
    rows = []
    for way in median:
        mine = [run for run in runs if run.way == way]
        rounds = " / ".join(f"{run.seconds:.1f}" for run in sorted(mine, key=lambda run: run.round))
        exits = statistics.median(run.exit_s for run in mine)
        tokens = f"{int(statistics.median(run.output_tokens for run in mine)):,}"
        same = [agreement(runs, way, reference) for reference in references]
        answered = f"{len(mine[0].answers)}/{lines}"
        rows.append([way, answered, f"{median[way]:.1f}", rounds, f"{exits:.1f}", tokens, *same])
    headers = ["contender", "answered", "median s", "rounds (s)", "exit s", "output tokens"]
    return markdown_table([*headers, *(f"= {reference}" for reference in references)], rows)


def goals_table(runs: list[Run]) -> str:
    """Each goal: the ratio of medians, the ratios paired by round, the limit, and whether it is met."""
    median = medians(runs)
    rows = []
    for way, reference, limit, meaning in GOALS:
        if way not in median or reference not in median:
            continue
        ratio = median[way] / median[reference]
        by_round = {run.round: run.seconds for run in runs if run.way == reference}
        paired = [run.seconds / by_round[run.round] for run in runs if run.way == way and run.round in by_round]
        paired_text = " / ".join(f"{value:.2f}" for value in paired)
        verdict = "met" if ratio <= limit else "not met"
        rows.append([f"{way} / {reference}", f"{ratio:.3f}x", paired_text, f"{limit:.2f}x", verdict, meaning])
    headers = ["goal", "ratio of medians", "paired by round", "at most", "", "what it means"]
    return markdown_table(headers, rows)


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(__doc__, data=GSM8K, rounds=2, **VLLM_ENGINE)
    parser.add_argument("--lines", type=int, default=256, help="questions (table rows, batch lines)")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per answer at most")
    parser.add_argument("--ways", default=",".join(WAYS), help="the contenders, comma-separated")
    parser.add_argument("--ray-python", type=Path, default=RAY_PYTHON, help="a Python with Ray Data LLM and vLLM")
    args = parser.parse_args()
    args.ways = tuple(way.strip() for way in args.ways.split(","))
    unknown = set(args.ways) - set(WAYS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; choose from {', '.join(WAYS)}")
    if "Ray Data LLM" in args.ways and not args.ray_python.exists():
        print(f"no {args.ray_python}: Ray Data LLM is left out (make ray-env, or --ray-python)", file=sys.stderr)
        args.ways = tuple(way for way in args.ways if way != "Ray Data LLM")
    return args


def main() -> None:
    args = parse_args()
    label = Path(args.model).name if args.model else BUNDLED_MODEL_NAME
    args.model = args.model or str(bundled_smollm2_path())
    with tempfile.TemporaryDirectory(prefix="bench-table-") as folder:
        inputs = write_inputs(gsm8k_questions(args.data, args.lines), args, Path(folder))
        tried = [
            run_once(way, number, args, inputs)
            for number in range(args.rounds)
            for way in round_order(number, args.ways)
        ]
    runs = [run for run in tried if run is not None]
    print(
        f"\n{args.lines} gsm8k questions (the gsm8k system prompt), at most {args.max_tokens} new tokens, greedy; "
        f"model {label}; engine: {' '.join(vllm_engine_flags(args))}, KV cache {args.kv_cache_gb:g} GiB; "
        f"seconds until the answers are written, loading included; medians of {args.rounds} alternating rounds\n"
    )
    print(contenders_table(runs, args.lines))
    print()
    print(goals_table(runs))
    write_chart_data(
        args.chart_data,
        title=f"The table job and its rivals: {args.lines} gsm8k questions, wall time with loading",
        unit="seconds until the answers are written, lower is better",
        rows=list(medians(runs).items()),
        note=f"{label}, vLLM's CPU build, {args.dtype}; medians of {args.rounds} alternating rounds",
        digits=1,
    )


if __name__ == "__main__":
    main()
