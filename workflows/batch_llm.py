"""Solve gsm8k with batched LLM inference on reusable GPU replicas.

    flyte run --local workflows/batch_llm.py main                 # on a laptop: bundled SmolLM2 on CPU, offline
    flyte run --local workflows/batch_llm.py main --engine vllm   # the same through real vLLM (its CPU build)
    flyte run workflows/batch_llm.py main --num_questions 1319 --model Qwen/Qwen2.5-1.5B-Instruct

The driver (`main`) loads the questions, cuts them into chunks and sends them to `infer_chunk`
(`workflows/llm_replica.py`), at most `max_chunks_in_flight` at a time. Each replica holds one
engine and one shared batcher; its concurrent calls batch together. Answers are scored as chunks
finish and written to a JSONL file; the run prints one summary line and returns the counts,
accuracy and throughput (model loading excluded) with the answers file.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from workflows.driver import Counts, JsonLines, check_failures, driver_env, fan_out, publish, summary_line
from workflows.gsm8k import SYSTEM_PROMPT, Problem, extract_answer, is_correct, load_problems
from workflows.llm_replica import infer_chunk
from workflows.report import Progress, final_html
from workflows.schema import ChatMessage, ChunkOutcome, EngineSettings, RequestChunk, RequestItem, RunSummary

logger = logging.getLogger("batch_llm")


@driver_env.task(report=True)
async def main(
    num_questions: int = 32,
    chunk_size: int = 8,
    source: str = "auto",
    engine: str = "auto",
    model: str = "",
    vllm_mode: str = "",
    max_model_len: int = 0,
    kv_cache_gb: float = 0.0,
    gpu_memory_utilization: float = 0.0,
    dtype: str = "",
    tensor_parallel_size: int = 0,
    enforce_eager: str = "",
    engine_args: str = "",
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    target_batch_tokens: int = 0,
    max_batch_size: int = 0,
    batch_timeout_s: float = 0.05,
    max_chunks_in_flight: int = 64,
    max_failed_fraction: float = 0.0,
    resume: bool = True,
    output_dir: str = "",
) -> RunSummary:
    """Answer gsm8k questions with batched LLM inference and score them.

    Args:
        num_questions: How many questions (clamped to what the source has).
        chunk_size: Questions per `infer_chunk` call.
        source: "auto" (the Hub when reachable, else the bundled sample), "hub", "sample", or a
            local .jsonl / .parquet path.
        engine: "auto" (vLLM on a GPU, else Transformers), "vllm" or "transformers".
        model: Hub id or local path; empty for the bundled SmolLM2-135M-Instruct.
        vllm_mode: "stream" (the default: each question is its own request to vLLM's continuous
            batching) or "batch" (whole batches through `LLM.generate`).
        max_model_len: vLLM's context length (0: the model's).
        kv_cache_gb: vLLM's KV cache in GiB (0: 2 GiB at most on CPU, vLLM's default on GPU).
        gpu_memory_utilization: vLLM's share of GPU memory (on CPU: of host memory) instead.
        dtype: Model dtype ("float32", "bfloat16", ...; empty: the engine's choice for the device).
        tensor_parallel_size: GPUs per replica for vLLM.
        enforce_eager: "true" to skip vLLM's graph compilation ("": the default for the device).
        engine_args: Any other vLLM engine argument, as a JSON object.
        max_new_tokens: Generation budget per answer.
        temperature: 0 for greedy decoding.
        target_batch_tokens: Token budget per batch (0: the engine's default).
        max_batch_size: Records per batch (0: the engine's default).
        batch_timeout_s: Longest a prompt waits for its batch to fill.
        max_chunks_in_flight: Chunks outstanding at once.
        max_failed_fraction: Share of questions that may fail before the run exits non-zero (their
            answers are still written).
        resume: Reuse chunks finished by an earlier run with the same questions and settings.
        output_dir: Also copy the answers file here (a local folder or a remote URI).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    loaded = await asyncio.to_thread(load_problems, source, num_questions)
    print(f"gsm8k source: {loaded.source}: {len(loaded.problems)} questions", flush=True)
    # Every engine option of this task's signature goes into the settings (the replica's key).
    settings = EngineSettings.from_options(locals(), resume=resume, system_prompt=SYSTEM_PROMPT)
    problems = {problem.index: problem for problem in loaded.problems}
    folder = Path(tempfile.mkdtemp(prefix="batch-llm-"))
    answers, failures = JsonLines(folder / "answers.jsonl"), JsonLines(folder / "failed.jsonl")
    tally = Tally()
    progress = Progress("gsm8k batch inference", total=len(problems))
    started = time.time()

    async def on_chunk(chunk: RequestChunk, outcome: ChunkOutcome | None, reason: str) -> None:
        reused = outcome is not None and outcome.finished_at < started
        for item, row in zip(chunk.items, _rows(chunk, outcome, reason), strict=True):
            scored = _score(row, problems[int(item.key)])
            tally.add(scored, fresh=not reused)
            (failures if scored["error"] else answers).write(scored)
        tally.reused_chunks += reused
        await progress.update(tally.done, tally.failed, tally.accuracy_text())

    try:
        fanned = await fan_out(
            _chunks(loaded.problems, chunk_size),
            lambda chunk: infer_chunk(chunk, settings),
            on_chunk,
            max_in_flight=max_chunks_in_flight,
        )
    finally:
        answers.close()
        failures.close()
    summary = RunSummary(
        source=loaded.source,
        requests=len(problems),
        answered=tally.done - tally.failed,
        failed=tally.failed,
        reused_chunks=tally.reused_chunks,
        accuracy=tally.correct / tally.scored if tally.scored else 0.0,
        scored=tally.scored,
        load_time_s=fanned.load_time_s,
        inference_s=fanned.inference_s,
        requests_per_s=fanned.per_second(tally.fresh_answers),
        output_tokens_per_s=fanned.per_second(tally.fresh_tokens),
        results=await publish(answers.path, output_dir),
        errors=await publish(failures.path, output_dir),
    )
    await progress.finish(final_html(summary, fanned.replicas))
    print(summary_line(summary, "questions"), flush=True)
    check_failures(tally.failed, len(problems), max_failed_fraction, f"answers are in {summary.results.path}")
    return summary


class Tally(Counts):
    """Running counts, plus accuracy over the questions with a gold answer."""

    def __init__(self) -> None:
        super().__init__()
        self.correct = self.scored = 0

    def add(self, row: dict[str, object], *, fresh: bool) -> None:
        self.count(failed=bool(row["error"]), completion_tokens=int(row["completion_tokens"]), fresh=fresh)  # type: ignore[call-overload]
        if not row["error"] and row["gold"] is not None:
            self.scored += 1
            self.correct += bool(row["correct"])

    def accuracy_text(self) -> str:
        return f"accuracy so far {self.correct / self.scored:.1%}" if self.scored else ""


def _chunks(problems: list[Problem], chunk_size: int) -> Iterator[RequestChunk]:
    for number, start in enumerate(range(0, len(problems), chunk_size)):
        items = [
            RequestItem(key=str(problem.index), messages=[ChatMessage("user", problem.question)])
            for problem in problems[start : start + chunk_size]
        ]
        yield RequestChunk(number, items)


def _rows(chunk: RequestChunk, outcome: ChunkOutcome | None, reason: str) -> Iterator[dict[str, object]]:
    for position, item in enumerate(chunk.items):
        result = outcome.results[position] if outcome is not None else None
        question = item.messages[0].content
        if result is None or result.error_code:
            error = reason if result is None else result.error_message
            yield {
                "index": int(item.key),
                "question": question,
                "completion": "",
                "predicted": None,
                "completion_tokens": 0,
                "error": error,
            }
            continue
        predicted = extract_answer(result.text)
        yield {
            "index": int(item.key),
            "question": question,
            "completion": result.text,
            "predicted": predicted,
            "completion_tokens": result.completion_tokens,
            "error": "",
        }


def _score(row: dict[str, object], problem: Problem) -> dict[str, object]:
    row["gold"] = problem.gold
    row["correct"] = not row["error"] and is_correct(row["predicted"], problem.gold)  # type: ignore[arg-type]
    return row
