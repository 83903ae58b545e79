"""Compact constrained output: the table job's `--response-format` run, its output tokens and wall time.

`flyteplugins-batcher run-table --response-format schema.json` over gsm8k questions (greedy, the
bundled SmolLM2-135M), on each engine, with the package of two source trees: a revision before a
change (`--before REV`, checked out with `git archive` into a temporary folder) and this tree. The
JSON answers are compared parsed (the same values, whatever the whitespace); the table gives each
engine's output tokens (in all, per row, per answer that parses), the share of answers that parse,
the rows whose JSON is equal in both runs, the tokens per token of the same JSON written compact
(the goal: at least 20% fewer), and the wall time.

    python benchmarks/bench_compact_json.py --before 7110aee~1          # the commit before compact JSON
    python benchmarks/bench_compact_json.py --quick --engines transformers --before 7110aee~1

Or one tree at a time, then the two result files side by side:

    python benchmarks/bench_compact_json.py --tree /tmp/old --label before --json before.json
    python benchmarks/bench_compact_json.py --label after --json after.json
    python benchmarks/bench_compact_json.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._contenders import run_command
from benchmarks._harness import GSM8K, REPO_ROOT, benchmark_parser, gsm8k_questions
from benchmarks._tables import markdown_table

SCHEMA = {
    "type": "object",
    "properties": {
        "steps": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "answer": {"type": "integer"},
        "unit": {"type": "string"},
        "confident": {"type": "boolean"},
    },
    "required": ["steps", "answer", "unit", "confident"],
}
"""An answer with several fields, as a pipeline asks for one: the whitespace between them is what compaction saves."""

_INFERENCE = re.compile(r"inference ([\d.]+) s, model load ([\d.]+) s")


def table_command(engine: str, args: argparse.Namespace, folder: Path) -> list[str]:
    """`run-table` over `folder`'s questions with the schema as the response format, on `engine`."""
    command = [sys.executable, "-m", "flyteplugins_batcher", "run-table", "-i", str(folder / "questions.parquet")]
    command += ["-o", str(folder / f"out-{engine}"), "--prompt", "Solve it, answering in JSON: {question}"]
    command += ["--response-format", str(folder / "schema.json"), "--engine", engine]
    command += ["--max-new-tokens", str(args.max_tokens), "--temperature", "0", "--no-resume"]
    command += ["--max-failed-fraction", "1"]
    if engine == "vllm":
        command += ["--max-model-len", str(args.max_model_len), "--kv-cache-gb", f"{args.kv_cache_gb:g}"]
        command += ["--dtype", args.dtype]
    return command


def run_once(engine: str, tree: Path, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One run-table run of the package in `tree` on `engine`: its tokens, times and answers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": gsm8k_questions(args.data, args.rows)}), folder / "questions.parquet")
    (folder / "schema.json").write_text(json.dumps(SCHEMA))
    ran = run_command(table_command(engine, args, folder), folder, env={"PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"})
    if ran.returncode != 0:
        raise SystemExit(ran.failure(f"{engine} run of {tree}"))
    table = pq.read_table(folder / f"out-{engine}").to_pylist()
    inference = _INFERENCE.search(ran.stdout)
    return {
        "engine": engine,
        "rows": len(table),
        "answered": sum(row["error"] is None for row in table),
        "output_tokens": sum(row["num_generated_tokens"] or 0 for row in table),
        "wall_s": ran.exit_s,
        "inference_s": float(inference.group(1)) if inference else None,
        "answers": [row["generated_text"] for row in table],
        "tokens": [row["num_generated_tokens"] for row in table],
    }


def run_tree(tree: Path, label: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every engine's run of the package in `tree`, with the load average at its end."""
    runs = {}
    for engine in args.engines.split(","):
        with tempfile.TemporaryDirectory(prefix="bench-compact-") as folder:
            run = runs[engine] = run_once(engine, tree, args, Path(folder))
        print(
            f"{label} {engine}: {run['output_tokens']} output tokens, {run['answered']}/{run['rows']} fit, "
            f"{run['wall_s']:.1f} s wall, {run['inference_s']} s inference",
            flush=True,
        )
    return {"label": label, "tree": str(tree), "load": os.getloadavg(), "runs": runs}


def parsed(answer: Any) -> Any:
    """An answer's JSON value: the table job's output column holds it parsed already (a struct), else its text is
    parsed (`None` for no answer or text that does not parse)."""
    if not isinstance(answer, str):
        return answer
    try:
        return json.loads(answer)
    except json.JSONDecodeError:
        return None


def same_json_tokens(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[int, int]]:
    """(tokens before, tokens after) of each row whose answer is the same JSON value in both runs."""
    rows = zip(old["answers"], new["answers"], old["tokens"], new["tokens"], strict=True)
    return [
        (old_tokens, new_tokens)
        for old_answer, new_answer, old_tokens, new_tokens in rows
        if parsed(old_answer) is not None and parsed(old_answer) == parsed(new_answer)
    ]


def compact_tokens(value: Any, tokenizer: Any) -> int:
    """The tokens `value` takes written as compact JSON (`{"a":1}`), its end-of-text token included."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1


def overhead(run: dict[str, Any], tokenizer: Any) -> tuple[int, float]:
    """The answers of `run` that parse, and the tokens they took per token of the same values written compact.

    Two runs rarely write the same JSON (the grammar changes what a greedy model says), so this compares
    their answers by what each costs against its own compact tokenization, the same JSON content: 1.0 is
    no whitespace and the tokenizer's own split (a model under a grammar may split the text more finely).
    """
    fitted = [(tokens, parsed(answer)) for answer, tokens in zip(run["answers"], run["tokens"], strict=True)]
    fitted = [(tokens, value) for tokens, value in fitted if value is not None]
    compact = sum(compact_tokens(value, tokenizer) for _, value in fitted)
    return len(fitted), sum(tokens for tokens, _ in fitted) / max(compact, 1)


def per_answer(run: dict[str, Any]) -> str:
    """Output tokens per row, and per answer that parses."""
    tokens = [tokens or 0 for tokens, answer in zip(run["tokens"], run["answers"], strict=True) if parsed(answer)]
    return f"{run['output_tokens'] / max(run['rows'], 1):.1f} / {sum(tokens) / max(len(tokens), 1):.1f}"


def parsing(run: dict[str, Any]) -> str:
    """The share of answers whose JSON parses (and fits the schema: the table job fails the others)."""
    count = sum(parsed(answer) is not None for answer in run["answers"])
    return f"{count}/{run['rows']} ({count / max(run['rows'], 1):.0%})"


def same_json(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The rows whose answers are equal JSON values in both runs, and how their tokens changed."""
    same = same_json_tokens(old, new)
    if not same:
        return f"0/{old['rows']}"
    before, after = sum(tokens for tokens, _ in same), sum(tokens for _, tokens in same)
    return f"{len(same)}/{old['rows']}: {before} -> {after} tokens ({after / max(before, 1) - 1:+.0%})"


def goal_met(before: dict[str, Any], after: dict[str, Any], tokenizer: Any) -> bool:
    """At least 20% fewer tokens per token of the same JSON written compact, on every engine both runs ran."""
    changes = [
        overhead(after["runs"][engine], tokenizer)[1] / max(overhead(old, tokenizer)[1], 1e-9) - 1
        for engine, old in before["runs"].items()
        if engine in after["runs"]
    ]
    return bool(changes) and max(changes) <= -0.20


def compare(before: dict[str, Any], after: dict[str, Any], tokenizer: Any) -> str:
    """A table of each engine's runs side by side: output tokens (in all, per row and per parsed answer), the
    answers that parse, the rows whose JSON is equal in both (and their tokens), and what the parsed answers cost
    per token of the same values written compact (`overhead`: the same JSON content, whatever each run said)."""
    table = []
    for engine, old in before["runs"].items():
        new = after["runs"].get(engine)
        if new is None:
            continue
        change = new["output_tokens"] / max(old["output_tokens"], 1) - 1
        old_ratio, new_ratio = overhead(old, tokenizer)[1], overhead(new, tokenizer)[1]
        table.append(
            [
                engine,
                f"{old['output_tokens']:,} -> {new['output_tokens']:,} ({change:+.0%})",
                f"{per_answer(old)} -> {per_answer(new)}",
                f"{parsing(old)} -> {parsing(new)}",
                same_json(old, new),
                f"{old_ratio:.2f} -> {new_ratio:.2f} ({new_ratio / max(old_ratio, 1e-9) - 1:+.0%})",
                f"{old['wall_s']:.1f} -> {new['wall_s']:.1f}",
                f"{old['inference_s']} -> {new['inference_s']}",
            ]
        )
    headers = ["engine", "output tokens", "tokens per row / per parsed answer", "answers that parse"]
    headers += ["rows with equal JSON", "tokens per compact token of the same JSON", "wall s", "inference s"]
    return markdown_table(headers, table)


def write_chart(path: Path | None, before: dict[str, Any], after: dict[str, Any]) -> None:
    """The chart: each engine's output tokens before and after."""
    names = {"transformers": "Transformers", "vllm": "vLLM"}
    rows = [
        (f"{names.get(engine, engine)}, {result['label']}", float(result["runs"][engine]["output_tokens"]))
        for engine in before["runs"]
        if engine in after["runs"]
        for result in (before, after)
    ]
    write_chart_data(
        path,
        title="Structured answers: output tokens for the same questions, before and after compact JSON",
        unit="output tokens (fewer is better)",
        rows=rows,
        note="The table job's --response-format run over gsm8k questions, greedy, the bundled SmolLM2-135M "
        "(benchmarks/bench_compact_json.py).",
        digits=0,
    )


def checked_out(revision: str, folder: Path) -> Path:
    """This repository's `revision` written into `folder` (`git archive`: no worktree to clean up)."""
    archive = subprocess.run(["git", "archive", revision], cwd=REPO_ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(
        __doc__, data=GSM8K, json=None, quick=False, dtype="float32", max_model_len=2048, kv_cache_gb=1.0
    )
    parser.add_argument("--engines", default="transformers,vllm", help="the engines to run, comma-separated")
    parser.add_argument("--before", help="a git revision to run first, labelled 'before', then this tree 'after'")
    parser.add_argument("--tree", type=Path, default=REPO_ROOT, help="the source tree whose package runs")
    parser.add_argument("--rows", type=int, default=64, help="gsm8k questions in the table")
    parser.add_argument("--max-tokens", type=int, default=160, help="each answer's max new tokens")
    parser.add_argument("--label", default="run", help="this run's name in --compare's table (before, after)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="two --json files")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.max_tokens = min(args.rows, 8), min(args.max_tokens, 64)
    return args


def main() -> None:
    args = parse_args()
    if args.compare or args.before:
        if args.compare:
            before, after = (json.loads(path.read_text()) for path in args.compare)
        else:
            with tempfile.TemporaryDirectory(prefix="bench-compact-before-") as folder:
                before = run_tree(checked_out(args.before, Path(folder)), f"before ({args.before})", args)
            after = run_tree(args.tree, "after", args)
            if args.json is not None:
                args.json.write_text(json.dumps({"before": before, "after": after}))
        from transformers import AutoTokenizer

        from flyteplugins_batcher.engines import bundled_smollm2_path

        tokenizer = AutoTokenizer.from_pretrained(str(bundled_smollm2_path()))
        print(f"\n{before['label']} -> {after['label']}, load {after['load']}\n")
        print(compare(before, after, tokenizer))
        met = goal_met(before, after, tokenizer)
        print(f"\ngoal (at least 20% fewer tokens per token of the same JSON): {'met' if met else 'not met'}")
        write_chart(args.chart_data, before, after)
        return
    result = run_tree(args.tree, args.label, args)
    if args.json is not None:
        args.json.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
