"""vLLM batch mode vs stream mode, against vLLM's own offline limit, in one process (real vLLM).

The same gsm8k questions, rendered once to token ids, are answered four ways:

(a) vLLM's own `LLM.generate(all prompts)`, which knows every request up front: the limit.
(b) `flyte.extras.TokenBatcher` as its docs show: `llm.generate` called inside `async def`.
(c) our batch mode: `VLLMEngine` behind our `TokenBatcher` (`engine.batcher()`).
(d) our stream mode: `VLLMStreamEngine` behind our `TokenBatcher` (`engine.batcher()`).

(b)-(d) are fed the way the workflow feeds a replica: chunks (default 8 questions) that arrive over
time (default every 1.5 s), each awaiting its answers like an `infer_batch` task. Reported: questions
and output tokens per second (model loading excluded), and vLLM's engine steps (scheduler
iterations: the count of its `vllm:iteration_tokens_total` histogram) with tokens per step. Steps
are the figure that carries over to a GPU, where a step of a small model costs about the same at
batch 8 or 128; wall time on a CPU is compute-bound and noisy.

The "arrival bound" row answers whether the steps (d) takes beyond (a) come from the arrival
pattern itself: no engine can produce a request's tokens before the request arrives, so a run
takes at least, for every request, the steps vLLM had already taken when it arrived plus the
tokens it generated; the bound is the largest of those.

Runs unchanged on a GPU (`--model` a hub id or path there; engine arguments with `--engine-args`).

    python benchmarks/bench_vllm.py                      # 128 questions, 128 new tokens, chunks of 8 every 1.5 s
    python benchmarks/bench_vllm.py --questions 16 --max-new-tokens 16 --ways a,d   # a quick run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: `benchmarks` imports

from benchmarks._charts import write_chart_data
from benchmarks._harness import SHARED_GSM8K, benchmark_parser, gsm8k_rows, write_rows_json
from benchmarks._tables import markdown_table
from flyteplugins_batcher import TokenBatcher
from flyteplugins_batcher.engines import Completion, GenerationConfig, bundled_smollm2_path, create_engine
from flyteplugins_batcher.engines.vllm import parse_engine_args
from flyteplugins_batcher.engines.vllm._args import running_on_cpu, with_device_defaults

SYSTEM_PROMPT = "You are a careful math tutor. Solve the problem step by step, then give the final number."
WAYS = {
    "a": "(a) vLLM LLM.generate(all prompts)",
    "b": "(b) flyte.extras TokenBatcher, as its docs show",
    "c": "(c) ours, batch mode",
    "d": "(d) ours, stream mode",
}


@dataclass
class WayResult:
    """What one way measured."""

    way: str
    wall_s: float
    steps: int
    step_tokens: float
    completions: list[Completion] = field(default_factory=list)
    steps_at_arrival: list[int] = field(default_factory=list)  # vLLM's steps taken before each question arrived
    batch_p99_wait_s: float | None = None

    @property
    def output_tokens(self) -> int:
        return sum(completion.completion_tokens for completion in self.completions)


def engine_steps() -> tuple[int, float]:
    """vLLM's scheduler iterations so far in this process, and the tokens they processed."""
    from vllm.v1.metrics.reader import Histogram, get_metrics_snapshot

    steps, tokens = 0, 0.0
    for metric in get_metrics_snapshot():
        if metric.name == "vllm:iteration_tokens_total" and isinstance(metric, Histogram):
            steps += metric.count
            tokens += metric.sum
    return steps, tokens


def load_questions(path: Path, count: int) -> list[list[dict[str, str]]]:
    questions = [row["question"] for row in gsm8k_rows(path)[:count]]
    return [[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": q}] for q in questions]


async def feed_in_chunks(
    ask: Callable[[Sequence[Any]], Awaitable[list[Any]]], records: Sequence[Any], chunk: int, interval_s: float
) -> tuple[list[Any], list[int]]:
    """Send `records` as chunks arriving `interval_s` apart, each awaiting its own answers.

    Also returns, per record, how many steps vLLM had taken when its chunk arrived.
    """
    started = time.perf_counter()
    tasks, steps_at_arrival = [], []
    for number, start in enumerate(range(0, len(records), chunk)):
        if number:
            await asyncio.sleep(max(started + number * interval_s - time.perf_counter(), 0.0))
        part = records[start : start + chunk]
        steps_at_arrival.extend([engine_steps()[0]] * len(part))
        tasks.append(asyncio.create_task(ask(part)))
    answers = [answer for chunk_answers in await asyncio.gather(*tasks) for answer in chunk_answers]
    return answers, steps_at_arrival


def measured(way: str, run: Callable[[], tuple[list[Completion], list[int], float | None]]) -> WayResult:
    steps_before, tokens_before = engine_steps()
    started = time.perf_counter()
    completions, steps_at_arrival, wait_p99 = run()
    wall = time.perf_counter() - started
    steps_after, tokens_after = engine_steps()
    steps = steps_after - steps_before
    return WayResult(
        way,
        wall,
        steps,
        (tokens_after - tokens_before) / steps if steps else 0.0,
        completions,
        [at - steps_before for at in steps_at_arrival],
        wait_p99,
    )


def run_raw_llm(args: argparse.Namespace, messages: list[Any], engine_args: dict[str, Any]) -> list[WayResult]:
    """(a) and (b): one `vllm.LLM`, used directly and through flyte.extras."""
    import vllm
    from flyte import extras

    llm = vllm.LLM(args.model, **engine_args)
    tokenizer = llm.get_tokenizer()
    token_ids = [
        tokenizer.encode(
            tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True), add_special_tokens=False
        )
        for m in messages
    ]
    prompts = [{"prompt_token_ids": ids} for ids in token_ids]
    params = vllm.SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)

    def completions_of(outputs: list[Any]) -> list[Completion]:
        return [
            Completion(o.outputs[0].text, len(o.prompt_token_ids), len(o.outputs[0].token_ids), "stop") for o in outputs
        ]

    results = []
    if "a" in args.ways:
        results.append(
            measured(WAYS["a"], lambda: (completions_of(llm.generate(prompts, params, use_tqdm=False)), [], None))
        )
    if "b" in args.ways:

        async def inference(batch: list[dict[str, Any]]) -> list[Any]:
            return llm.generate(batch, params, use_tqdm=False)  # blocking, as the flyte.extras example does

        async def through_flyte() -> tuple[list[Completion], list[int], float | None]:
            async with extras.TokenBatcher(inference_fn=inference) as batcher:

                async def ask(part: Sequence[int]) -> list[Any]:
                    futures = [
                        await batcher.submit(prompts[i], estimated_tokens=len(token_ids[i]) + args.max_new_tokens)
                        for i in part
                    ]
                    return list(await asyncio.gather(*futures))

                outputs, arrivals = await feed_in_chunks(ask, range(len(prompts)), args.chunk_size, args.interval_s)
            return completions_of(outputs), arrivals, None

        results.append(measured(WAYS["b"], lambda: asyncio.run(through_flyte())))
    shutdown = getattr(getattr(llm.llm_engine, "engine_core", None), "shutdown", None)
    if callable(shutdown):
        shutdown()
    return results


def run_ours(args: argparse.Namespace, messages: list[Any], mode: str, engine_args: dict[str, Any]) -> WayResult:
    """(c) or (d): our engine for the mode, behind its own `batcher()`."""
    model = None if args.model == str(bundled_smollm2_path()) else args.model
    engine = create_engine(
        "vllm", model, mode=mode, generation=GenerationConfig(max_new_tokens=args.max_new_tokens), **engine_args
    )
    engine.load()

    async def through_ours() -> tuple[list[Completion], list[int], float | None]:
        batcher: TokenBatcher[Any, Completion] = engine.batcher()
        async with batcher:

            async def ask(part: Sequence[Any]) -> list[Any]:
                return await batcher.run(part)

            answers, arrivals = await feed_in_chunks(ask, messages, args.chunk_size, args.interval_s)
        return answers, arrivals, batcher.stats.queue_wait_s.p99

    result = measured(WAYS["c" if mode == "batch" else "d"], lambda: asyncio.run(through_ours()))
    engine.close()
    return result


def arrival_bound_steps(result: WayResult) -> int:
    """The fewest steps any engine could take, given when each request arrived (see above)."""
    return max(
        steps + completion.completion_tokens
        for steps, completion in zip(result.steps_at_arrival, result.completions, strict=True)
    )


def parse_args() -> argparse.Namespace:
    parser = benchmark_parser(__doc__, data=SHARED_GSM8K, json=None, model=str(bundled_smollm2_path()))
    parser.add_argument("--questions", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=8, help="questions per arriving chunk (b-d)")
    parser.add_argument("--interval-s", type=float, default=1.5, help="seconds between chunks (b-d)")
    parser.add_argument("--engine-args", default="", help='vLLM engine arguments as JSON, e.g. {"max_model_len": 2048}')
    parser.add_argument("--ways", default="abcd", help="which of a, b, c, d to run")
    return parser.parse_args()


HEADERS = [
    "way",
    "answered",
    "questions/s",
    "output tokens/s",
    "engine steps",
    "tokens/step",
    "q/s vs (a)",
    "steps vs (b)",
    "dispatch p99 ms",
]


def table_rows(results: list[WayResult], questions: int) -> list[list[Any]]:
    """One row per way, compared with vLLM's own limit (a) and flyte.extras (b), and the arrival bound."""
    limit = next((result for result in results if result.way == WAYS["a"]), None)
    flyte = next((result for result in results if result.way == WAYS["b"]), None)
    rows = []
    for result in results:
        questions_per_s = len(result.completions) / result.wall_s
        rows.append(
            [
                result.way,
                f"{len(result.completions)}/{questions}",
                questions_per_s,
                result.output_tokens / result.wall_s,
                result.steps,
                result.step_tokens,
                f"{questions_per_s / (len(limit.completions) / limit.wall_s):.2f}" if limit else "-",
                f"{result.steps / flyte.steps:.2f}" if flyte else "-",
                f"{1000 * result.batch_p99_wait_s:.0f}" if result.batch_p99_wait_s is not None else "-",
            ]
        )
    stream = next((result for result in results if result.way == WAYS["d"]), None)
    if stream is not None and stream.steps:
        rows.append(["arrival bound for (d)", "-", "-", "-", arrival_bound_steps(stream), "-", "-", "-", "-"])
    return rows


def main() -> None:
    args = parse_args()

    messages = load_questions(args.data, args.questions)
    # vLLM's metrics (the step counts) need its stats on; the rest are the device's defaults.
    engine_args = {
        "disable_log_stats": False,
        **with_device_defaults(parse_engine_args(args.engine_args), on_cpu=running_on_cpu()),
    }
    results = run_raw_llm(args, messages, engine_args) if {"a", "b"} & set(args.ways) else []
    for way, mode in (("c", "batch"), ("d", "stream")):
        if way in args.ways:
            results.append(run_ours(args, messages, mode, engine_args))

    rows = table_rows(results, args.questions)
    print(
        f"\n{args.questions} gsm8k questions, {args.max_new_tokens} new tokens, greedy; (b)-(d) in chunks of "
        f"{args.chunk_size} every {args.interval_s} s; model loading excluded\n"
    )
    print(markdown_table(HEADERS, rows))
    write_rows_json(args.json, HEADERS, rows)
    write_chart_data(
        args.chart_data,
        title=f"vLLM engine steps for {args.questions} gsm8k questions, {args.max_new_tokens} new tokens, greedy",
        unit="engine steps, fewer is better",
        rows=[(row[0], row[4]) for row in rows if isinstance(row[4], (int, float))],
        note=f"Real vLLM; (b)-(d) fed in chunks of {args.chunk_size} arriving {args.interval_s:g} s apart "
        "(benchmarks/bench_vllm.py).",
        digits=0,
    )


if __name__ == "__main__":
    main()
