"""Solve gsm8k with batched LLM inference on reusable GPU replicas.

    flyte run --local workflows/batch_llm.py main          # on a laptop: bundled SmolLM2 on CPU, offline
    flyte run workflows/batch_llm.py main --num_questions 1319 --model Qwen/Qwen2.5-1.5B-Instruct

The driver (`main`) loads the questions, cuts them into chunks and sends every chunk to
`infer_batch` at once. `infer_batch` runs on the GPU environment: reusable replicas, each one
process holding one engine and one shared batcher (`SharedBatcher`). Up to `concurrency`
calls run on a replica at the same time and all feed that one batcher, which assembles
token-budgeted batches and keeps the model busy while the calls load and post-process.

Replicas, per-replica concurrency and the GPU type are environment-level settings, fixed when the
module is imported: set `BATCH_LLM_REPLICAS`, `BATCH_LLM_CONCURRENCY` and `BATCH_LLM_GPU` (for
example `A100:1`, or `none` for CPU replicas) before `flyte run` / `flyte deploy`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

import flyte
import flyte.errors
import flyte.report

from flyteplugins_batcher import SharedBatcher, TokenBatcher, inference_environment
from flyteplugins_batcher.engines import Completion, Engine, GenerationConfig, InvalidPromptError, create_engine
from images import driver_image, gpu_image
from workflows.gsm8k import SYSTEM_PROMPT, Problem, extract_answer, is_correct, load_problems
from workflows.report import final_html, progress_html
from workflows.schema import (
    Answer,
    Chunk,
    ChunkResult,
    InferenceSettings,
    ReplicaSnapshot,
    RunResult,
)

logger = logging.getLogger("batch_llm")

REPLICAS = int(os.environ.get("BATCH_LLM_REPLICAS", "2"))
CONCURRENCY = int(os.environ.get("BATCH_LLM_CONCURRENCY", "10"))
GPU = os.environ.get("BATCH_LLM_GPU", "L4:1")
CHUNK_RETRIES = 2

gpu_env = inference_environment(
    "batch_llm_gpu",
    image=gpu_image,
    gpu=None if GPU.lower() == "none" else GPU,
    replicas=REPLICAS,
    concurrency=CONCURRENCY,
)

driver_env = flyte.TaskEnvironment(
    name="batch_llm_driver",
    image=driver_image,
    resources=flyte.Resources(cpu=2, memory="4Gi"),
    depends_on=[gpu_env],
)


# -- the GPU side ------------------------------------------------------------------------------


def load_engine(settings: InferenceSettings) -> Engine:
    """Build and load the engine once per replica (runs in a worker thread)."""
    engine = create_engine(
        settings.engine,  # type: ignore[arg-type]
        settings.model or None,
        generation=GenerationConfig(
            max_new_tokens=settings.max_new_tokens, temperature=settings.temperature, seed=settings.seed
        ),
        system_prompt=settings.system_prompt or None,
    )
    engine.load()
    return engine


def make_batcher(engine: Engine, settings: InferenceSettings) -> TokenBatcher:
    """The replica's batcher, from the engine's defaults and the run's overrides."""
    # "split": a record that breaks a whole batch must not fail the other tasks' records batched with it.
    overrides: dict[str, object] = {
        "batch_timeout_s": settings.batch_timeout_s,
        "on_error": "split",
        "name": "batch_llm",
    }
    if settings.target_batch_tokens:
        overrides["target_batch_tokens"] = settings.target_batch_tokens
    if settings.max_batch_size:
        overrides["max_batch_size"] = settings.max_batch_size
    return engine.batcher(**overrides)


LLM: SharedBatcher[Engine, TokenBatcher] = SharedBatcher(load_engine, make_batcher, name="batch_llm")


@gpu_env.task(retries=CHUNK_RETRIES)
async def infer_batch(chunk: Chunk, settings: InferenceSettings) -> ChunkResult:
    """Generate completions for one chunk through the replica's shared batcher.

    A prompt the engine cannot run (empty, too long) comes back as an error in its slot. Any
    other failure fails the chunk, so that Flyte retries it.
    """
    batcher = await LLM.get(settings)
    outcomes = await batcher.run(chunk.prompts, return_exceptions=True)
    completions, errors, prompt_tokens, completion_tokens = [], [], 0, 0
    for outcome in outcomes:
        if isinstance(outcome, Completion):
            completions.append(outcome.text)
            errors.append("")
            prompt_tokens += outcome.prompt_tokens
            completion_tokens += outcome.completion_tokens
        elif isinstance(outcome, InvalidPromptError):
            completions.append("")
            errors.append(str(outcome))
        else:
            raise RuntimeError(f"chunk {chunk.index}: inference failed: {outcome!r}") from outcome
    return ChunkResult(chunk.index, completions, errors, prompt_tokens, completion_tokens, replica_snapshot(batcher))


def replica_snapshot(batcher: TokenBatcher) -> ReplicaSnapshot:
    """This replica's batcher and engine statistics, labelled with the pod (host) and process."""
    stats = batcher.stats
    engine = LLM.loaded_model
    engine_stats = engine.stats if engine is not None else None
    return ReplicaSnapshot(
        replica=f"{socket.gethostname()}/{os.getpid()}",
        records=stats.total_completed,
        batches=stats.total_batches,
        avg_batch_size=stats.avg_batch_size,
        avg_batch_tokens=stats.avg_batch_cost,
        utilization=stats.utilization,
        records_per_s=stats.records_per_s,
        latency_p50_s=stats.latency_s.p50,
        latency_p99_s=stats.latency_s.p99,
        queue_wait_p99_s=stats.queue_wait_s.p99,
        batches_by_reason=dict(stats.batches_by_reason),
        padding_efficiency=engine_stats.padding_efficiency if engine_stats else 1.0,
        completion_tokens_per_s=engine_stats.completion_tokens_per_s if engine_stats else 0.0,
    )


# -- the driver --------------------------------------------------------------------------------


@driver_env.task(report=True)
async def main(
    num_questions: int = 32,
    chunk_size: int = 8,
    source: str = "auto",
    engine: str = "auto",
    model: str = "",
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    target_batch_tokens: int = 0,
    max_batch_size: int = 0,
    batch_timeout_s: float = 0.05,
) -> RunResult:
    """Answer gsm8k questions with batched LLM inference and score them.

    Args:
        num_questions: How many questions (clamped to what the source has).
        chunk_size: Questions per `infer_batch` call.
        source: "auto" (the Hub when reachable, else the bundled sample), "hub", "sample", or a
            local .jsonl / .parquet path.
        engine: "auto" (vLLM on a GPU, else Transformers), "vllm" or "transformers".
        model: Hub id or local path; empty for the bundled SmolLM2-135M-Instruct.
        max_new_tokens: Generation budget per answer.
        temperature: 0 for greedy decoding.
        target_batch_tokens: Token budget per batch (0: the engine's default).
        max_batch_size: Records per batch (0: the engine's default).
        batch_timeout_s: Longest a prompt waits for its batch to fill.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    loaded = await asyncio.to_thread(load_problems, source, num_questions)
    banner = f"gsm8k source: {loaded.source}: {len(loaded.problems)} questions"
    print(banner, flush=True)
    settings = InferenceSettings(
        engine=engine,
        model=model,
        system_prompt=SYSTEM_PROMPT,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        target_batch_tokens=target_batch_tokens,
        max_batch_size=max_batch_size,
        batch_timeout_s=batch_timeout_s,
    )
    problems = loaded.problems
    chunks = [
        Chunk(
            start // chunk_size,
            [p.index for p in problems[start : start + chunk_size]],
            [p.question for p in problems[start : start + chunk_size]],
        )
        for start in range(0, len(problems), chunk_size)
    ]

    problems_by_index = {problem.index: problem for problem in problems}
    progress = _Progress(total=len(problems))
    started = time.perf_counter()

    async def run_chunk(chunk: Chunk) -> tuple[list[Answer], ChunkResult | None]:
        try:
            result: ChunkResult | None = await infer_batch(chunk, settings)
            answers = score_chunk(chunk, result, problems_by_index)
        except Exception as exc:  # Flyte retried it already; keep the other chunks' answers
            logger.error("chunk %d (questions %s) failed after retries: %s", chunk.index, chunk.question_ids, exc)
            result = None
            answers = [_failed_answer(problems_by_index[i], f"chunk failed: {exc}") for i in chunk.question_ids]
        await progress.update(answers, time.perf_counter() - started)
        return answers, result

    outcomes = await asyncio.gather(*(run_chunk(chunk) for chunk in chunks))
    run = summarize(loaded.source, outcomes, time.perf_counter() - started)
    await _report(flyte.report.replace.aio, final_html(run))
    print(
        f"accuracy {run.accuracy:.1%} on {run.scored} scored | {run.questions_per_s:.2f} questions/s | "
        f"{run.tokens_per_s:.0f} tokens/s | failed {len(run.failed_questions)}",
        flush=True,
    )
    return run


def score_chunk(chunk: Chunk, result: ChunkResult, problems_by_index: dict[int, Problem]) -> list[Answer]:
    """One answer per question of the chunk: the extracted number, checked against the gold one."""
    answers = []
    for index, completion, error in zip(chunk.question_ids, result.completions, result.errors, strict=True):
        problem = problems_by_index[index]
        if error:
            answers.append(_failed_answer(problem, error))
            continue
        predicted = extract_answer(completion)
        answers.append(
            Answer(index, problem.question, completion, predicted, problem.gold, is_correct(predicted, problem.gold))
        )
    return answers


def summarize(source: str, outcomes: list[tuple[list[Answer], ChunkResult | None]], wall_s: float) -> RunResult:
    """Accuracy, throughput and the replicas' latest statistics for the whole run."""
    answers = [answer for chunk_answers, _ in outcomes for answer in chunk_answers]
    replicas: dict[str, ReplicaSnapshot] = {}
    completion_tokens = 0
    for _, result in outcomes:
        if result is None:
            continue
        completion_tokens += result.completion_tokens
        seen = replicas.get(result.replica.replica)
        if seen is None or result.replica.records >= seen.records:  # the latest snapshot of each replica
            replicas[result.replica.replica] = result.replica
    scored = [answer for answer in answers if answer.gold is not None and not answer.error]
    failed = [answer.index for answer in answers if answer.error]
    answered = len(answers) - len(failed)
    return RunResult(
        source=source,
        questions=len(answers),
        answered=answered,
        failed_questions=failed,
        accuracy=sum(answer.correct for answer in scored) / len(scored) if scored else 0.0,
        scored=len(scored),
        wall_s=wall_s,
        questions_per_s=answered / wall_s if wall_s > 0 else 0.0,
        tokens_per_s=completion_tokens / wall_s if wall_s > 0 else 0.0,
        replicas=sorted(replicas.values(), key=lambda snapshot: snapshot.replica),
        answers=answers,
    )


def _failed_answer(problem: Problem, error: str) -> Answer:
    return Answer(problem.index, problem.question, "", None, problem.gold, False, error)


class _Progress:
    """Live report updates as chunks complete (throttled: each flush rewrites the report)."""

    def __init__(self, total: int, min_interval_s: float = 0.5) -> None:
        self.total = total
        self.done = self.failed = self.correct = self.scored = 0
        self._min_interval_s = min_interval_s
        self._last_flush = 0.0

    async def update(self, answers: list[Answer], elapsed_s: float) -> None:
        self.done += len(answers)
        self.failed += sum(1 for answer in answers if answer.error)
        scored = [answer for answer in answers if answer.gold is not None and not answer.error]
        self.scored += len(scored)
        self.correct += sum(answer.correct for answer in scored)
        now = time.monotonic()
        if now - self._last_flush < self._min_interval_s and self.done < self.total:
            return
        self._last_flush = now
        html = progress_html(self.done, self.total, self.failed, elapsed_s, self.correct, self.scored)
        await _report(flyte.report.replace.aio, html)


async def _report(update: Callable[..., Awaitable[None]], html: str) -> None:
    try:
        await update(html, do_flush=True)
    except Exception as exc:  # the report is a view; it must never fail the run
        logger.warning("could not update the report: %s", exc)
