"""LoRA adapters and several base models in one run-batch file, against the same lines run on one model alone.

Two questions (issue 35, deliverable 5), on vLLM's CPU build with the bundled SmolLM2-135M-Instruct:

- **adapters**: a file whose lines go a third each to the base model and to two LoRA adapters
  (`--lora-modules alpha=... beta=...`, made with peft) against the same lines all on the base model,
  in a run with no adapters. Goal: at most 1.3x its time.
- **two base models**: a file whose lines go half to SmolLM2 and half to a second checkpoint (SmolLM2 with
  a seeded adapter merged into its weights; `--model A --model B`), against each half run alone on its
  model. Goal: at most the sum of the two runs alone (each loads its model once, as the two-model run
  loads each once).

Every way is one `python -m flyteplugins_batcher run-batch --engine vllm --no-resume` process from start to
exit, as a user runs it; the wall time includes the process's start and the model loads. The summary
line each run prints gives its inference and load times too. Rounds alternate every way, so that a
machine's drift reaches all of them; the tables give medians. Answers are compared with the runs alone
(greedy decoding: each line's text should match its model's run alone).

    python benchmarks/bench_models.py                          # 48 lines of 32 tokens, 2 rounds
    python benchmarks/bench_models.py --lines 12 --rounds 1    # a quick run
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._contenders import batch_answers, chat_line, fresh_folder, ours_on_vllm, run_command
from benchmarks._harness import SAMPLE_GSM8K, VLLM_ENGINE, benchmark_parser, gsm8k_rows
from benchmarks._lora_models import make_adapters, make_merged_model
from benchmarks._tables import markdown_table
from flyteplugins_batcher.engines import bundled_smollm2_path

SUMMARY = re.compile(r"\(inference ([\d.]+) s, model load ([\d.]+) s\)")
ADAPTERS = ("alpha", "beta")


@dataclass(frozen=True)
class Way:
    """One command of a round: its name, its lines (custom_id -> model named) and the models it declares."""

    name: str
    lines: dict[str, str]
    models: tuple[str, ...]
    adapters: bool = False


@dataclass
class Run:
    """One command's run: wall time, the inference and load times its summary printed, and its answers."""

    way: str
    wall_s: float
    inference_s: float
    load_s: float
    answers: dict[str, str] = field(default_factory=dict)


def ways(lines: int, base: str, merged: str) -> list[Way]:
    """The five commands of a round: base alone, base with adapters, two models, and each half alone."""
    ids = [f"q{number}" for number in range(lines)]
    mixed = {key: (base, *ADAPTERS)[number % 3] for number, key in enumerate(ids)}
    halves = {key: (base, merged)[number % 2] for number, key in enumerate(ids)}
    return [
        Way("base alone", dict.fromkeys(ids, base), (base,)),
        Way("base + 2 adapters", mixed, (base,), adapters=True),
        Way("SmolLM2 half alone", {key: model for key, model in halves.items() if model == base}, (base,)),
        Way("merged half alone", {key: model for key, model in halves.items() if model == merged}, (merged,)),
        Way("two models", halves, (base, merged)),
    ]


def write_requests(way: Way, questions: list[str], max_tokens: int, target: Path) -> Path:
    """The way's chat lines: each custom_id `qN` asks gsm8k question N of its model (or adapter)."""
    with target.open("w") as out:
        for key, model in way.lines.items():
            question = questions[int(key[1:]) % len(questions)]
            out.write(chat_line(key, [{"role": "user", "content": question}], model, max_tokens) + "\n")
    return target


def command(way: Way, requests: Path, out: Path, adapters: dict[str, str], args: argparse.Namespace) -> list[str]:
    lora = ["--lora-modules", *(f"{name}={path}" for name, path in adapters.items())] if way.adapters else []
    return [*ours_on_vllm(args, "run-batch", "-i", str(requests), "-o", str(out), models=way.models), *lora]


def run_once(way: Way, requests: Path, adapters: dict[str, str], args: argparse.Namespace, scratch: Path) -> Run:
    """Run one way's command to its exit and read its summary line and its answers."""
    out = fresh_folder(scratch)
    finished = run_command(command(way, requests, out, adapters, args), scratch)
    if finished.returncode != 0:
        raise SystemExit(finished.failure(way.name))
    found = SUMMARY.search(finished.stdout)
    inference, load = (float(found.group(1)), float(found.group(2))) if found else (0.0, 0.0)
    run = Run(way.name, finished.exit_s, inference, load, batch_answers(out / "results.jsonl")[0])
    print(
        f"{way.name}: {run.wall_s:.1f} s (inference {inference:.1f} s, load {load:.1f} s), {len(run.answers)} answers"
    )
    for line in finished.stdout.splitlines():
        if line.startswith("model "):
            print(f"    {line}")
    sys.stdout.flush()
    return run


def median(runs: list[Run], way: str, value: str) -> float:
    return statistics.median(getattr(run, value) for run in runs if run.way == way)


def agreement(runs: list[Run], way: str, references: list[str], keys: set[str] | None = None) -> float:
    """The share of a way's answers (of `keys`, if given) equal to the same line's in the reference ways' first runs."""
    reference: dict[str, str] = {}
    for name in references:
        reference |= next(run for run in runs if run.way == name).answers
    mine = [run for run in runs if run.way == way]
    pairs = [
        (answer, reference[key]) for run in mine for key, answer in run.answers.items() if keys is None or key in keys
    ]
    return sum(answer == expected for answer, expected in pairs) / len(pairs) if pairs else 0.0


def tables(runs: list[Run], plan: list[Way]) -> tuple[str, dict[str, float]]:
    """The table of each way's medians, and the ratios the goals are about."""
    rows = []
    for way in plan:
        mine = [run for run in runs if run.way == way.name]
        rounds = " / ".join(f"{run.wall_s:.1f}" for run in mine)
        medians = [f"{median(runs, way.name, value):.1f}" for value in ("wall_s", "inference_s", "load_s")]
        rows.append([way.name, len(way.lines), *medians, rounds])
    wall = {way.name: median(runs, way.name, "wall_s") for way in plan}
    busy = {way.name: median(runs, way.name, "inference_s") + median(runs, way.name, "load_s") for way in plan}
    alone = ("SmolLM2 half alone", "merged half alone")
    ratios = {
        "adapters / base alone, wall": wall["base + 2 adapters"] / wall["base alone"],
        "adapters / base alone, inference": median(runs, "base + 2 adapters", "inference_s")
        / median(runs, "base alone", "inference_s"),
        "two models / sum of halves alone, wall": wall["two models"] / sum(wall[name] for name in alone),
        "two models / sum of halves' inference + loads": busy["two models"] / sum(busy[name] for name in alone),
    }
    headers = ["way", "lines", "median wall s", "inference s", "model load s", "rounds (wall s)"]
    return markdown_table(headers, rows), ratios


def parse_args() -> argparse.Namespace:
    # A smaller engine than the other contenders'; no --model: the models are SmolLM2 and a merged copy of it.
    engine = {**VLLM_ENGINE, "max_model_len": 1024, "max_num_seqs": 64, "kv_cache_gb": 1.0}
    del engine["model"]
    parser = benchmark_parser(__doc__, data=SAMPLE_GSM8K, rounds=2, **engine)
    parser.add_argument("--lines", type=int, default=48, help="chat lines in the one-model and mixed files")
    parser.add_argument("--max-tokens", type=int, default=32, help="each line's max_tokens")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    questions = [row["question"] for row in gsm8k_rows(args.data)]
    with tempfile.TemporaryDirectory(prefix="bench-models-") as folder:
        scratch = Path(folder)
        base = str(bundled_smollm2_path())
        adapters = make_adapters(scratch / "adapters", base)
        merged = make_merged_model(scratch / "smollm2-merged", base)
        plan = ways(args.lines, base, merged)
        files = {
            way.name: write_requests(way, questions, args.max_tokens, scratch / f"{n}.jsonl")
            for n, way in enumerate(plan)
        }
        runs = [run_once(way, files[way.name], adapters, args, scratch) for _ in range(args.rounds) for way in plan]
    report(runs, plan, args)


def report(runs: list[Run], plan: list[Way], args: argparse.Namespace) -> None:
    """Print the table, the ratios against their goals and the answers' agreement; write the chart's data."""
    rendered, ratios = tables(runs, plan)
    print(
        f"\n{args.lines} gsm8k chat lines of at most {args.max_tokens} tokens, greedy; SmolLM2-135M-Instruct and a "
        f"merged checkpoint of it; vLLM CPU build, {args.dtype}, --max-num-seqs {args.max_num_seqs}, KV cache "
        f"{args.kv_cache_gb:g} GiB; wall time per command, start and loads included; medians of {args.rounds} "
        "alternating rounds\n"
    )
    print(rendered)
    print()
    for name, ratio in ratios.items():
        goal = 1.3 if name.startswith("adapters") else 1.0
        print(f"{name}: {ratio:.2f}x (goal <= {goal}x: {'met' if ratio <= goal else 'NOT met'})")
    mixed = next(way for way in plan if way.adapters)
    base_keys = {key for key, model in mixed.lines.items() if model not in ADAPTERS}
    base_lines = agreement(runs, mixed.name, ["base alone"], base_keys)
    two = agreement(runs, "two models", ["SmolLM2 half alone", "merged half alone"])
    print(f"answers equal to the runs alone: two models {two:.0%}; base lines of the adapter file {base_lines:.0%}")
    walls = {way.name: median(runs, way.name, "wall_s") for way in plan}
    alone = walls["SmolLM2 half alone"] + walls["merged half alone"]
    write_chart_data(
        args.chart_data,
        title=f"One run-batch file, several models: {args.lines} chat lines",
        unit="seconds per command (start and loads included), lower is better",
        rows=[*walls.items(), ("the two halves alone, summed", alone)],
        note=f"SmolLM2-135M on vLLM's CPU build; medians of {args.rounds} alternating rounds",
        digits=1,
    )


if __name__ == "__main__":
    main()
