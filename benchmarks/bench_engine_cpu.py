"""CPU engine benchmark: the same gsm8k questions through the bundled SmolLM2, six ways, in one process.

Modes (greedy, float32, `max_new_tokens` 64 by default):

1. one at a time: `engine.generate([question])` for each question in turn.
2. fixed batches: `engine.generate(chunk)` over chunks of `--batch-size` in input order, the offline
   ideal this benchmark's goal is set against.
3. flyte.extras.TokenBatcher, used as its docs show: `async def inference(batch)` that calls the
   blocking `engine.generate` directly (so the event loop stalls while the model runs).
4. ours: `flyteplugins_batcher.TokenBatcher(inference_fn=engine.generate, ...)` with mode 3's
   settings; the plain `def` runs in a worker thread.
5. ours as a plain script writes it: `TokenBatcher(inference_fn=generate, max_batch_size=16,
   target_batch_tokens=2000)` around a plain `def generate(batch)`, with no token estimator
   (each record costs 1, so batches are cut by size alone).
6. ours as the workflows use it: `engine.batcher(max_batch_size=16)`, the engine's own settings
   (its token counts, and records of similar length batched together: `grouping="by_cost"`).

In modes 3-6, `--producers` concurrent producers share the questions round-robin; each submits
all of its questions, then awaits its answers. Modes 3 and 4 get the same settings:
`max_batch_size=--batch-size` (16, the fixed-batch size), `token_estimator=engine.estimate_tokens`
(the tokenizer's exact prompt count + `max_new_tokens`), and `target_batch_tokens` set so that a
full batch of the longest question fits (it never binds before `max_batch_size` does). The other
settings are the defaults (`batch_timeout_s=0.05`, `min_batch_size=1`).

Modes 2-6 take turns for `--rounds` rounds (3 by default), and the table shows each one's median
round, so that the machine's drift in speed falls on all of them alike, and each round's ratio to
the fixed batches of the same round.

Run from the repository root:

    python benchmarks/bench_engine_cpu.py [--questions 32]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._harness import SHARED_GSM8K, benchmark_parser, gsm8k_rows, median_run, through_producers
from benchmarks._tables import markdown_table
from flyteplugins_batcher.engines import Completion, GenerationConfig
from flyteplugins_batcher.engines.transformers import TransformersEngine

SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the word problem step by step, showing each calculation. "
    "Finish with a final line of the form 'The answer is N', where N is a number."
)


@dataclass(frozen=True)
class ModeResult:
    """What one mode measured."""

    name: str
    seconds: float
    batches: int
    answers: list[str]
    padding_efficiency: float

    def questions_per_s(self) -> float:
        return len(self.answers) / self.seconds

    def avg_batch_size(self) -> float:
        return len(self.answers) / self.batches


def load_questions(path: Path, count: int) -> list[str]:
    """The first `count` questions of a gsm8k JSONL file."""
    questions = [row["question"] for row in gsm8k_rows(path)[:count]]
    if len(questions) < count:
        raise SystemExit(f"{path} has only {len(questions)} questions, fewer than --questions {count}")
    return questions


def texts(results: Sequence[Completion | Exception]) -> list[str]:
    """Completion texts; any failed record aborts the benchmark, since its numbers would be meaningless."""
    failures = [result for result in results if isinstance(result, Exception)]
    if failures:
        raise RuntimeError(f"{len(failures)} records failed, first: {failures[0]!r}")
    return [result.text for result in results if isinstance(result, Completion)]


def measure(name: str, engine: TransformersEngine, run: Callable[[], tuple[list[str], int]]) -> ModeResult:
    """Time `run` (which returns the answers and how many batches it used) and read the engine's padding."""
    real_before, padded_before = engine.stats.real_tokens, engine.stats.padded_tokens
    started = time.perf_counter()
    answers, batches = run()
    seconds = time.perf_counter() - started
    real, padded = engine.stats.real_tokens - real_before, engine.stats.padded_tokens - padded_before
    result = ModeResult(name, seconds, batches, answers, real / padded if padded else 1.0)
    print(
        f"  {name}: {seconds:.1f} s, {result.questions_per_s():.2f} questions/s, "
        f"avg batch {result.avg_batch_size():.1f}",
        flush=True,
    )
    return result


def one_at_a_time(engine: TransformersEngine, questions: list[str]) -> tuple[list[str], int]:
    return [texts(engine.generate([question]))[0] for question in questions], len(questions)


def fixed_batches(engine: TransformersEngine, questions: list[str], batch_size: int) -> tuple[list[str], int]:
    chunks = [questions[start : start + batch_size] for start in range(0, len(questions), batch_size)]
    return [text for chunk in chunks for text in texts(engine.generate(chunk))], len(chunks)


async def answers_of(batcher: Any, questions: list[str], producers: int) -> tuple[list[str], int]:
    """The answers to `questions` through a started batcher, fed by `producers` producers; then it is stopped.

    Also returns how many batches the batcher sent.
    """
    try:
        results = await through_producers(batcher.submit, questions, producers)
    finally:
        await batcher.stop()
    return texts(results), batcher.stats.total_batches


def batcher_settings(engine: TransformersEngine, questions: list[str], batch_size: int) -> dict[str, Any]:
    """The settings both batchers share: size-capped batches, budgeted with the engine's exact token counts."""
    longest = max(engine.estimate_tokens(question) for question in questions)
    return {
        "token_estimator": engine.estimate_tokens,
        "max_batch_size": batch_size,
        "target_batch_tokens": longest * batch_size,
    }


def flyte_extras_batcher(
    engine: TransformersEngine, questions: list[str], batch_size: int, producers: int
) -> tuple[list[str], int]:
    from flyte.extras import TokenBatcher

    async def inference(batch: list[str]) -> list[Completion | Exception]:
        return engine.generate(batch)  # as the docs show: the model call blocks the event loop

    async def main() -> tuple[list[str], int]:
        batcher = TokenBatcher(inference_fn=inference, **batcher_settings(engine, questions, batch_size))
        await batcher.start()
        return await answers_of(batcher, questions, producers)

    return asyncio.run(main())


def through_our_batcher(make_batcher: Callable[[], Any], questions: list[str], producers: int) -> tuple[list[str], int]:
    """The answers and batch count of `questions` through the batcher that `make_batcher` builds."""

    async def main() -> tuple[list[str], int]:
        batcher = make_batcher()
        await batcher.start()
        return await answers_of(batcher, questions, producers)

    return asyncio.run(main())


def our_ways(engine: TransformersEngine, questions: list[str], batch_size: int) -> dict[str, Callable[[], Any]]:
    """Modes 4-6: the batchers of ours that the modes build (see the module notes)."""
    from flyteplugins_batcher import TokenBatcher

    def generate(batch: list[str]) -> list[Completion | Exception]:  # as a plain script writes it
        return engine.generate(batch)

    return {
        "4. flyteplugins_batcher TokenBatcher": lambda: TokenBatcher(
            inference_fn=engine.generate, **batcher_settings(engine, questions, batch_size)
        ),
        "5. ours, a plain script's TokenBatcher": lambda: TokenBatcher(
            inference_fn=generate, max_batch_size=batch_size, target_batch_tokens=2000
        ),
        "6. ours, the engine's own `engine.batcher()`": lambda: engine.batcher(max_batch_size=batch_size),
    }


def modes_table(
    results: list[ModeResult], ideal: ModeResult, flyte: ModeResult, reference: ModeResult, paired: dict[str, str]
) -> str:
    """Each mode's questions/s against the fixed batches and flyte.extras, its batches and its answers."""
    rows = []
    for result in results:
        same = sum(a == b for a, b in zip(result.answers, reference.answers, strict=True))
        rows.append(
            [
                result.name,
                f"{result.questions_per_s():.2f}",
                f"{result.avg_batch_size():.1f}",
                f"{result.questions_per_s() / ideal.questions_per_s():.2f}x",
                paired.get(result.name, ""),
                f"{result.questions_per_s() / flyte.questions_per_s():.2f}x",
                f"{result.padding_efficiency:.2f}",
                f"{same}/{len(result.answers)}",
            ]
        )
    headers = ["mode", "questions/s", "avg batch", "vs fixed batches", "paired rounds", "vs flyte.extras"]
    headers += ["padding eff.", "answers = one-at-a-time"]
    return markdown_table(headers, rows, align="lrrrlrrl")


def workload_parser(description: str) -> argparse.ArgumentParser:
    """The flags of the CPU LLM benchmarks: the questions, the generation, the batches, the rounds."""
    parser = benchmark_parser(description, data=SHARED_GSM8K, threads=2, rounds=3)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--producers", type=int, default=4)
    return parser


def parse_args() -> argparse.Namespace:
    return workload_parser(__doc__).parse_args()


def main() -> None:
    args = parse_args()
    questions = load_questions(args.data.resolve(), args.questions)
    engine = TransformersEngine(
        generation=GenerationConfig(max_new_tokens=args.max_new_tokens),
        system_prompt=SYSTEM_PROMPT,
        device="cpu",
        dtype="float32",
        num_threads=args.threads,
    )
    started = time.perf_counter()
    engine.load()
    print(f"Loaded bundled SmolLM2 in {time.perf_counter() - started:.1f} s; {len(questions)} questions", flush=True)
    engine.generate(questions[:2])  # warm-up: the first call pays one-off allocation and dispatch costs

    reference = measure("1. one at a time", engine, lambda: one_at_a_time(engine, questions))
    # The other modes take turns round by round, so that a drift in the machine's speed (wall time
    # here varies by about 10%) falls on all of them alike; the median round of each is shown.
    ways = {
        f"2. fixed batches of {args.batch_size}": lambda: fixed_batches(engine, questions, args.batch_size),
        "3. flyte.extras TokenBatcher": lambda: flyte_extras_batcher(
            engine, questions, args.batch_size, args.producers
        ),
    }
    for name, make_batcher in our_ways(engine, questions, args.batch_size).items():
        ways[name] = functools.partial(through_our_batcher, make_batcher, questions, args.producers)
    runs: dict[str, list[ModeResult]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, run in ways.items():
            runs[name].append(measure(name, engine, run))
    medians = [median_run(rounds, lambda result: result.seconds) for rounds in runs.values()]
    fixed_rounds = next(iter(runs.values()))
    paired = {
        name: " / ".join(f"{base.seconds / mine.seconds:.2f}" for base, mine in zip(fixed_rounds, rounds, strict=True))
        for name, rounds in runs.items()
    }
    print()
    print(
        f"SmolLM2-135M-Instruct float32 on CPU, {args.threads} threads, greedy, max_new_tokens "
        f"{args.max_new_tokens}, {len(questions)} gsm8k questions, {args.producers} producers; "
        f"modes 2-6: median of {args.rounds} rounds\n"
    )
    print(modes_table([reference, *medians], medians[0], medians[1], reference, paired))
    write_chart_data(
        args.chart_data,
        title=f"SmolLM2-135M-Instruct on CPU: {len(questions)} gsm8k questions, max_new_tokens {args.max_new_tokens}",
        unit=f"questions/s, higher is better (modes 2-6: median of {args.rounds} rounds)",
        rows=[(result.name, result.questions_per_s()) for result in [reference, *medians]],
        note=f"Greedy, float32, {args.threads} threads, {args.producers} producers (benchmarks/bench_engine_cpu.py).",
    )


if __name__ == "__main__":
    main()
