"""Solve gsm8k with batched LLM inference on reusable GPU replicas.

    flyte run --local workflows/batch_llm.py main                 # on a laptop: bundled SmolLM2 on CPU, offline
    flyte run --local workflows/batch_llm.py main --engine vllm   # the same through real vLLM (its CPU build)
    flyte run workflows/batch_llm.py main --num_questions 1319 --model Qwen/Qwen2.5-1.5B-Instruct

The driver (`solve_gsm8k`) loads the questions, cuts them into chunks and sends them to `infer_chunk`
(`flyteplugins_batcher/replica/_llm.py`), at most `max_chunks_in_flight` at a time (by default replicas x
concurrency: every replica's slots, sized to the engine by `size_in_flight`). Each replica holds one
engine and one shared batcher; its concurrent calls batch together. Answers are scored as chunks
finish and written to a JSONL file; the run prints one summary line and returns the counts,
accuracy and throughput (model loading excluded) with the answers file.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from flyteplugins_batcher.jobs._driver import fan_out
from flyteplugins_batcher.jobs._environments import LLM_POOL, LLM_SIZING, driver_environment, gpu_env
from flyteplugins_batcher.jobs._finish import finish_run
from flyteplugins_batcher.jobs._gsm8k import SYSTEM_PROMPT, Problem, extract_answer, is_correct, load_problems
from flyteplugins_batcher.jobs._options import task_with_options
from flyteplugins_batcher.jobs._outputs import Destination, JsonLines, WorkFolder
from flyteplugins_batcher.jobs._replica_tasks import infer_chunk
from flyteplugins_batcher.jobs._report import Progress
from flyteplugins_batcher.jobs._reruns import retrying_reused_failures
from flyteplugins_batcher.jobs._run_options import RunOptions
from flyteplugins_batcher.jobs._summary import Counts, RunSummary
from flyteplugins_batcher.replica import ChatMessage, ChunkOutcome, EngineSettings, RequestChunk, RequestItem

logger = logging.getLogger("batch_llm")

OUTPUT_FILES = ("answers.jsonl", "failed.jsonl")

_TOKEN_COUNTS = ("completion_tokens", "prompt_tokens", "cached_tokens")
"""A row's token counts: generated, read, and read from the engine's prefix cache."""

gsm8k_driver_env = driver_environment("batch_llm_driver", gpu_env)


@task_with_options(gsm8k_driver_env, report=True)
async def solve_gsm8k(
    num_questions: int = 32,
    source: str = "auto",
    run: RunOptions = RunOptions(chunk_size=LLM_SIZING.chunk_size),
    settings: EngineSettings = EngineSettings(system_prompt=SYSTEM_PROMPT),
) -> RunSummary:
    """Answer gsm8k questions with batched LLM inference and score them.

    Args:
        num_questions: How many questions (clamped to what the source has).
        source: "auto" (the Hub when reachable, else the bundled sample), "hub", "sample", or a
            local .jsonl / .parquet path.
        run: How the run is chunked, resumed and written.
        settings: The engine, generation and batcher settings.
    """
    destination = Destination.check(run.output_dir, OUTPUT_FILES)  # before any inference
    loaded = await asyncio.to_thread(load_problems, source, num_questions)
    print(f"gsm8k source: {loaded.source}: {len(loaded.problems)} questions", flush=True)
    work = WorkFolder("batch-llm-", destination)
    scorer = _Scorer(loaded.problems, work.path, started=time.time())
    fanned = None
    try:
        fanned = await fan_out(
            _chunks(loaded.problems, run.chunk_size),
            retrying_reused_failures(
                lambda chunk, salt: infer_chunk(chunk, settings, salt), salt=run.cache_salt(), started=scorer.started
            ),
            scorer.on_chunk,
            max_in_flight=run.chunks_in_flight(LLM_POOL),
        )
    finally:
        scorer.close()
        if fanned is None:
            work.discard()  # the run failed as a whole; its error says why
    tally = scorer.tally
    return await finish_run(
        tally,
        fanned,
        source=loaded.source,
        work=work,
        results=scorer.answers.path,
        errors=scorer.failures.path,
        run=run,
        pool=LLM_POOL,
        progress=scorer.progress,
        noun="questions",
        accuracy=tally.correct / tally.scored if tally.scored else 0.0,
        scored=tally.scored,
    )


class _Scorer:
    """Scores each finished chunk's answers as it comes: the answers and failures files, the tally, the progress."""

    def __init__(self, problems: list[Problem], folder: Path, *, started: float) -> None:
        self.problems = {problem.index: problem for problem in problems}
        self.answers, self.failures = (JsonLines(folder / name) for name in OUTPUT_FILES)
        self.tally = Tally()
        self.progress = Progress("gsm8k batch inference", total=len(problems), noun="questions")
        self.started = started

    async def on_chunk(self, chunk: RequestChunk, outcome: ChunkOutcome | None, reason: str) -> None:
        for position, (item, row) in enumerate(zip(chunk.items, _rows(chunk, outcome, reason), strict=True)):
            scored = _score(row, self.problems[int(item.key)])
            fresh = outcome is None or outcome.computed_since(position, self.started)
            self.tally.add(scored, fresh=fresh, retried=outcome is not None and outcome.was_retried(position))
            (self.failures if scored["error"] else self.answers).write(scored)
        await self.progress.update(self.tally, self.tally.accuracy_text())

    def close(self) -> None:
        self.answers.close()
        self.failures.close()


class Tally(Counts):
    """Running counts, plus accuracy over the questions with a gold answer."""

    def __init__(self) -> None:
        super().__init__()
        self.correct = self.scored = 0

    def add(self, row: dict[str, object], *, fresh: bool, retried: bool) -> None:
        completion, prompt, cached = (int(row[name]) for name in _TOKEN_COUNTS)  # type: ignore[call-overload]
        self.count(
            failed=bool(row["error"]),
            completion_tokens=completion,
            prompt_tokens=prompt,
            cached_tokens=cached,
            fresh=fresh,
            retried=retried,
        )
        if not row["error"] and row["gold"] is not None:
            self.scored += 1
            self.correct += bool(row["correct"])

    def accuracy_text(self) -> str:
        return f"accuracy so far {self.correct / self.scored:.1%}" if self.scored else ""


async def _chunks(problems: list[Problem], chunk_size: int) -> AsyncIterator[RequestChunk]:
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
                "prompt_tokens": 0,
                "cached_tokens": 0,
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
            "prompt_tokens": result.prompt_tokens,
            "cached_tokens": result.cached_tokens,
            "error": "",
        }


def _score(row: dict[str, object], problem: Problem) -> dict[str, object]:
    row["gold"] = problem.gold
    row["correct"] = not row["error"] and is_correct(row["predicted"], problem.gold)  # type: ignore[arg-type]
    return row
