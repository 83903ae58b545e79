"""A Transformers model of your own through a plain `TokenBatcher`, against the same model in fixed batches.

What a user's script does, with nothing of our engines in it: load SmolLM2-135M-Instruct with
`AutoModelForCausalLM` on the main thread, warm it up there, then

1. fixed batches: call `generate(chunk)` on the main thread for chunks of 16, in input order;
2. ours: hand the same plain `def generate(batch)` to
   `TokenBatcher(inference_fn=generate, max_batch_size=16, target_batch_tokens=2000)`, fed by 4
   producers that each submit their interleaved share (the batcher's worker thread runs it);
3. flyte.extras' `TokenBatcher` with the same settings and an `async def` around `generate`, as its
   docs show.

The model runs on the main thread in 1 and on a worker thread in 2, so this is where a second pool
of OpenMP threads would show (see `flyteplugins_batcher/_pipeline/openmp.py`). The ways take turns for
`--rounds` rounds in this one process (no other model in it, so no other thread holds a pool), and
each shows its median round. Greedy, float32, 2 torch threads.

    python benchmarks/bench_own_model_cpu.py [--questions 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks._charts import write_chart_data
from benchmarks._harness import through_producers
from benchmarks._tables import markdown_table
from benchmarks.bench_engine_cpu import SYSTEM_PROMPT, load_questions, workload_parser
from flyteplugins_batcher.engines import bundled_smollm2_path


class OwnModel:
    """SmolLM2 as a user loads it: Transformers' own classes, on the thread that builds it."""

    def __init__(self, max_new_tokens: int) -> None:
        path = bundled_smollm2_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.max_new_tokens = max_new_tokens

    def generate(self, questions: list[str]) -> list[str]:
        """Greedy answers to a batch of questions (a plain `def`, as a user writes it)."""
        prompts = [
            self.tokenizer.apply_chat_template(
                [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
                tokenize=False,
                add_generation_prompt=True,
            )
            for question in questions
        ]
        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            output = self.model.generate(
                **encoded,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            )
        new_tokens = output[:, encoded["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)


def fixed_batches(model: OwnModel, questions: list[str], batch_size: int) -> tuple[list[str], int]:
    chunks = [questions[start : start + batch_size] for start in range(0, len(questions), batch_size)]
    return [answer for chunk in chunks for answer in model.generate(chunk)], len(chunks)


def batched(batcher_class: Any, generate: Callable[[list[str]], Any], questions: list[str], producers: int, size: int):
    """Answers and batch count of `questions` through `batcher_class(inference_fn=generate, ...)`."""

    async def main() -> tuple[list[str], int]:
        batcher = batcher_class(inference_fn=generate, max_batch_size=size, target_batch_tokens=2000)
        await batcher.start()
        try:
            answers = await through_producers(batcher.submit, questions, producers)
        finally:
            await batcher.stop()
        return answers, batcher.stats.total_batches

    return asyncio.run(main())


def ways(model: OwnModel, questions: list[str], size: int, producers: int) -> dict[str, Callable[[], Any]]:
    from flyte.extras import TokenBatcher as ExtrasTokenBatcher

    from flyteplugins_batcher import TokenBatcher

    async def extras_generate(batch: list[str]) -> list[str]:
        return model.generate(batch)  # as flyte.extras' docs show: the model call blocks the event loop

    return {
        f"1. fixed batches of {size} on the main thread": lambda: fixed_batches(model, questions, size),
        "2. ours: plain `def generate` in TokenBatcher": lambda: batched(
            TokenBatcher, model.generate, questions, producers, size
        ),
        "3. flyte.extras TokenBatcher, as its docs show": lambda: batched(
            ExtrasTokenBatcher, extras_generate, questions, producers, size
        ),
    }


def parse_args() -> argparse.Namespace:
    return workload_parser(__doc__).parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    questions = load_questions(args.data.resolve(), args.questions)
    model = OwnModel(args.max_new_tokens)
    model.generate(questions[:2])  # the warm-up, on the main thread, as a script does it
    rounds: dict[str, list[Round]] = {}
    for round_number in range(args.rounds):
        for name, run in ways(model, questions, args.batch_size, args.producers).items():
            started = time.perf_counter()
            answers, batches = run()
            rounds.setdefault(name, []).append(Round(time.perf_counter() - started, answers, batches))
            print(f"  round {round_number + 1}, {name}: {rounds[name][-1].seconds:.1f} s", flush=True)
    print(
        f"\nSmolLM2-135M-Instruct (Transformers' own classes), {args.threads} torch threads, {len(questions)} questions"
    )
    print(table(rounds))
    fixed = statistics.median(r.seconds for r in next(iter(rounds.values())))
    write_chart_data(
        args.chart_data,
        title=f"A model of your own: SmolLM2 through Transformers' own classes, {len(questions)} gsm8k questions",
        unit=f"x fixed batches of {args.batch_size}, higher is better (median of {args.rounds} rounds)",
        rows=[(name, fixed / statistics.median(r.seconds for r in runs)) for name, runs in rounds.items()],
        note=f"CPU, {args.threads} torch threads, {args.producers} producers (benchmarks/bench_own_model_cpu.py).",
    )


@dataclass(frozen=True)
class Round:
    seconds: float
    answers: list[str]
    batches: int


def table(rounds: dict[str, list[Round]]) -> str:
    """Each way's median round against the fixed batches' (the first way) and flyte.extras' (the last)."""
    medians = {name: statistics.median(r.seconds for r in runs) for name, runs in rounds.items()}
    fixed, extras = next(iter(rounds.values())), list(rounds.values())[-1]
    rows = []
    for name, runs in rounds.items():
        paired = " / ".join(f"{base.seconds / mine.seconds:.2f}" for base, mine in zip(fixed, runs, strict=True))
        same = sum(a == b for a, b in zip(runs[-1].answers, fixed[-1].answers, strict=True))
        count = len(runs[-1].answers)
        rows.append(
            (
                name,
                count / medians[name],
                count / runs[-1].batches,
                f"{statistics.median(r.seconds for r in fixed) / medians[name]:.2f}x",
                paired,
                f"{statistics.median(r.seconds for r in extras) / medians[name]:.2f}x",
                f"{same}/{count}",
            )
        )
    headers = ["way", "questions/s", "avg batch", "vs fixed", "paired rounds", "vs flyte.extras", "answers = fixed"]
    return markdown_table(headers, rows)


if __name__ == "__main__":
    main()
