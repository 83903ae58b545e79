"""The first thing to run on a lent GPU: one script, a few minutes, torch and the package only, a table for the docs.

Two parts, each printed as a markdown table (and written as JSON with `--out`):

1. **The device's busy share with CPU work per record** (`bench_gpu.py`'s sweep, smaller): a real model
   on the device, producers that spend CPU time on every record, fed serially (the guide's sequential
   Gantt), through flyte.extras' `TokenBatcher` as its docs show (the blocking `async def`; skipped where
   flyte is not installed), through ours, and through ours with the preparation in worker processes.
2. **The Transformers engine**: a Llama of Llama-3.2-1B's shapes (a tiny one on a CPU) with random
   weights and a byte-level tokenizer built here (no files to carry), one prompt at a time, `generate` on
   all prompts at once, and ours (`engine.batcher()`), with NVML's utilization beside each.

It needs no vLLM, no flyte and no download, so it runs on a bare GPU machine from the repository root:

    python benchmarks/gpu_check.py --out gpu_check.json      # the device torch finds (CUDA if there is one)
    python benchmarks/gpu_check.py --device cpu --quick      # the same code path on a CPU, in seconds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_gpu, bench_gpu_engine
from benchmarks._tables import markdown_table
from flyteplugins_batcher import DeviceMonitor
from flyteplugins_batcher.engines import GenerationConfig
from flyteplugins_batcher.engines.transformers import TransformersEngine

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTIONS = [f"Question {n}: a train leaves at {n} o'clock at {10 * n} km/h; when does it arrive?" for n in range(512)]


def byte_tokenizer(folder: Path) -> Path:
    """A byte-level tokenizer (256 bytes and two markers) with a chat template, saved in `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {character: index for index, character in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab |= {"<|im_start|>": len(vocab), "<|im_end|>": len(vocab) + 1}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return folder


def busy_share(device: str, quick: bool) -> list[dict[str, Any]]:
    """Part 1: records/s and the device's busy share by each way, at CPU work of 0.5x, 1x and 2x the device's."""
    try:
        import flyte.extras  # noqa: F401
    except ImportError:
        del bench_gpu.WAYS["flyte.extras"]  # a bare GPU machine: the pattern it stands for is the serial one
    layers, hidden, intermediate, records = (2, 128, 256, 120) if quick else (8, 4096, 14336, 1500)
    model = bench_gpu.MlpDevice(device, hidden, intermediate, layers)
    _, rows = bench_gpu.sweep(model, bench_gpu.make_records(records, seed=0), [0.5, 1.0, 2.0], rounds=1)
    return rows


def engine_modes(device: str, quick: bool) -> list[dict[str, Any]]:
    """Part 2: one at a time, `generate` on all prompts at once, and ours, each with NVML's utilization."""
    count, single, new_tokens = (8, 2, 8) if quick else (128, 4, 128)
    questions = QUESTIONS[:count]
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = byte_tokenizer(Path(folder) / "tokenizer")
        shapes = bench_gpu_engine.TINY if quick else bench_gpu_engine.LLAMA_32_1B
        end = bench_gpu_engine.random_model(tokenizer, shapes, Path(folder) / "model", device)
        generation = GenerationConfig(max_new_tokens=new_tokens, logit_bias={end: -100})
        engine = TransformersEngine(str(Path(folder) / "model"), device=device, generation=generation)
        engine.load()
    engine.generate(questions[:8])  # warm-up
    rows = [
        bench_gpu_engine.measured(
            "one prompt at a time",
            engine,
            lambda: ([t for q in questions[:single] for t in texts(engine, [q])], single),
        ),
        bench_gpu_engine.measured("generate(all prompts at once)", engine, lambda: (texts(engine, questions), 1)),
        bench_gpu_engine.measured("ours: engine.batcher()", engine, lambda: asyncio.run(ours(engine, questions))),
    ]
    engine.close()
    return rows


def texts(engine: TransformersEngine, prompts: list[str]) -> list[str]:
    return bench_gpu_engine.texts(engine, prompts)


async def ours(engine: TransformersEngine, questions: list[str]) -> tuple[list[str], int]:
    async with engine.batcher() as batcher:
        answers = await batcher.run(questions)
        batches = batcher.stats.total_batches
    return [answer.text for answer in answers], batches


def engine_table(rows: list[dict[str, Any]]) -> str:
    return markdown_table(
        ["mode", "prompts", "tokens/s", "avg batch", "in a model call", "GPU busy (NVML)"],
        [
            [row["mode"], row["questions"], round(row["tokens_per_s"]), f"{row['avg_batch']:.1f}",
             f"{row['in_model_call']:.1%}", bench_gpu.share(row["nvml"])]
            for row in rows
        ],
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--device", default="auto", help="cuda, cpu, or auto (CUDA when torch finds a GPU)")
    parser.add_argument("--quick", action="store_true", help="toy sizes (the default on a CPU)")
    parser.add_argument("--out", default="", help="also write both parts' rows here, as JSON")
    args = parser.parse_args()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    quick = args.quick or device == "cpu"
    started = time.perf_counter()
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    nvml = DeviceMonitor().utilization().note
    print(f"{name} (torch {torch.__version__}); NVML: {nvml}", flush=True)
    busy = busy_share(device, quick)
    print("\n## The device's busy share with CPU work per record\n")
    print(bench_gpu.table(busy))
    modes = engine_modes(device, quick)
    print(f"\n## The Transformers engine on {name}\n")
    print(engine_table(modes))
    print(f"\n({time.perf_counter() - started:.0f} s)")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": name, "busy": busy, "engine": modes}, indent=2))
    bench_gpu.PROCESSES.shutdown()


if __name__ == "__main__":
    main()
