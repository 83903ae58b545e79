"""Compact constrained output: the table job's `--response-format` run, its output tokens and wall time.

`flyteplugins-batcher run-table --response-format schema.json` over gsm8k questions (greedy, the
bundled SmolLM2-135M), on each engine, with the package of a source tree of your choice: run it
once with the tree before a change (`--tree /path/to/old/checkout`) and once with this one, then
`--compare` the two result files. The JSON answers are compared parsed (the same values, whatever
the whitespace), and the output tokens and wall time side by side.

    flock /tmp/bench.lock python benchmarks/bench_compact_json.py --tree /tmp/old --label before --out before.json
    flock /tmp/bench.lock python benchmarks/bench_compact_json.py --label after --out after.json
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
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._charts import add_chart_flag, write_chart_data
from benchmarks._tables import markdown_table

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
SAMPLE_DATA = REPO_ROOT / "flyteplugins_batcher" / "jobs" / "data" / "gsm8k_sample.jsonl"
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


def run_once(engine: str, tree: Path, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One run-table run of the package in `tree` on `engine`: its tokens, times and answers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in args.data.read_text().splitlines()[: args.rows]]
    pq.write_table(pa.table({"question": [row["question"] for row in rows]}), folder / "questions.parquet")
    (folder / "schema.json").write_text(json.dumps(SCHEMA))
    output = folder / f"out-{engine}"
    command = [sys.executable, "-m", "flyteplugins_batcher", "run-table", "-i", str(folder / "questions.parquet")]
    command += ["-o", str(output), "--prompt", "Solve it, answering in JSON: {question}", "--response-format"]
    command += [str(folder / "schema.json"), "--engine", engine, "--max-new-tokens", str(args.max_tokens)]
    command += ["--temperature", "0", "--no-resume", "--max-failed-fraction", "1"]
    if engine == "vllm":
        command += ["--max-model-len", "2048", "--kv-cache-gb", "1", "--dtype", "float32"]
    environment = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    ran = subprocess.run(command, cwd=folder, env=environment, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - started
    if ran.returncode != 0:
        raise RuntimeError(f"{engine} run failed:\n{ran.stdout[-2000:]}\n{ran.stderr[-3000:]}")
    table = pq.read_table(output).to_pylist()
    inference = _INFERENCE.search(ran.stdout)
    return {
        "engine": engine,
        "rows": len(table),
        "answered": sum(row["error"] is None for row in table),
        "output_tokens": sum(row["num_generated_tokens"] or 0 for row in table),
        "wall_s": wall_s,
        "inference_s": float(inference.group(1)) if inference else None,
        "answers": [row["generated_text"] for row in table],
        "tokens": [row["num_generated_tokens"] for row in table],
    }


def compare(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A table of each engine's runs side by side, and the rows whose JSON is the same in both."""
    table = []
    for engine, old in before["runs"].items():
        new = after["runs"].get(engine)
        if new is None:
            continue
        same = [
            (old_tokens, new_tokens)
            for old_answer, new_answer, old_tokens, new_tokens in zip(
                old["answers"], new["answers"], old["tokens"], new["tokens"], strict=True
            )
            if old_answer is not None and old_answer == new_answer
        ]
        change = new["output_tokens"] / max(old["output_tokens"], 1) - 1
        saved = 1 - sum(new_tokens for _, new_tokens in same) / max(sum(old_tokens for old_tokens, _ in same), 1)
        table.append(
            [
                engine,
                f"{old['output_tokens']} -> {new['output_tokens']} ({change:+.0%})",
                f"{len(same)}/{old['rows']}: {saved:.0%} fewer tokens",
                f"{old['wall_s']:.1f} -> {new['wall_s']:.1f}",
                f"{old['inference_s']:.1f} -> {new['inference_s']:.1f}",
                f"{old['answered']} -> {new['answered']}",
            ]
        )
    headers = ["engine", "output tokens", "same JSON: its tokens", "wall s", "inference s", "answers that fit"]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--engines", default="transformers,vllm")
    parser.add_argument("--tree", type=Path, default=REPO_ROOT, help="the source tree whose package runs")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA if DEFAULT_DATA.exists() else SAMPLE_DATA)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", type=Path, default=None, help="write the runs here (JSON), for --compare")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    add_chart_flag(parser)
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(path.read_text()) for path in args.compare)
        print(f"{before['label']} -> {after['label']}, load {after['load']}\n")
        print(compare(before, after))
        write_chart(args.chart_data, before, after)
        return
    runs = {}
    with tempfile.TemporaryDirectory(prefix="bench-compact-") as folder:
        for engine in args.engines.split(","):
            runs[engine] = run_once(engine, args.tree, args, Path(folder))
            run = runs[engine]
            print(
                f"{args.label} {engine}: {run['output_tokens']} output tokens, {run['answered']}/{run['rows']} fit, "
                f"{run['wall_s']:.1f} s wall, {run['inference_s']} s inference",
                flush=True,
            )
    result = {"label": args.label, "tree": str(args.tree), "load": os.getloadavg(), "runs": runs}
    if args.out is not None:
        args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
