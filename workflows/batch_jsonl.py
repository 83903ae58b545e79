"""Batch jobs on your own data: an OpenAI-batch (or plain) JSONL file in, results and errors out.

    flyte run --local workflows/batch_jsonl.py main --input requests.jsonl
    flyte run workflows/batch_jsonl.py main --input s3://bucket/requests.jsonl --output_dir s3://bucket/out

Each input line is a request (`flyteplugins_batcher.batch_api` says what is accepted); a bad line
fails alone, with a line in the errors file naming its code and the reason, and every other line
still runs. The driver streams the file: it parses a line at a time, keeps at most
`max_chunks_in_flight` chunks outstanding, and writes results as chunks finish, so its memory does
not grow with the file. Finished chunks are cached by content and settings: re-running a job after
a crash recomputes only what had not finished. The run exits non-zero when more requests failed
than `max_failed_fraction` allows, after writing everything that did finish.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from flyte.io import File

from flyteplugins_batcher.batch_api import (
    BatchRequest,
    RequestLineError,
    SeenIds,
    error_line,
    parse_request_line,
    response_line,
)
from flyteplugins_batcher.engines import Completion, GenerationConfig, model_display_name
from workflows.driver import Counts, JsonLines, check_failures, driver_env, fan_out, publish, summary_line
from workflows.llm_replica import generation, infer_chunk
from workflows.report import Progress, final_html
from workflows.schema import (
    ChatMessage,
    ChunkOutcome,
    EngineSettings,
    ItemResult,
    RequestChunk,
    RequestItem,
    RunSummary,
)


@driver_env.task(report=True)
async def main(
    input: File,
    output_dir: str = "",
    chunk_size: int = 32,
    max_chunks_in_flight: int = 16,
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
    system_prompt: str = "",
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    target_batch_tokens: int = 0,
    max_batch_size: int = 0,
    batch_timeout_s: float = 0.05,
    model_mismatch: str = "error",
    max_failed_fraction: float = 0.0,
    resume: bool = True,
) -> RunSummary:
    """Run every request of a JSONL file; write OpenAI-batch result lines and error lines.

    Args:
        input: The requests, one JSON object per line (OpenAI batch lines, or plain
            `{"custom_id"?, "prompt" | "messages"}` lines).
        output_dir: Also copy `results.jsonl` and `errors.jsonl` here (a local folder or a remote URI).
        chunk_size: Requests per `infer_chunk` call.
        max_chunks_in_flight: Chunks outstanding at once (bounds the driver's memory).
        engine: "auto" (vLLM on a GPU, else Transformers), "vllm" or "transformers".
        model: Hub id or local path; empty for the bundled SmolLM2-135M-Instruct.
        vllm_mode: "stream" (default) or "batch".
        max_model_len: vLLM's context length (0: the model's).
        kv_cache_gb: vLLM's KV cache in GiB (0: the device's default).
        gpu_memory_utilization: vLLM's share of GPU memory (on CPU: of host memory) instead.
        dtype: Model dtype (empty: the engine's choice for the device).
        tensor_parallel_size: GPUs per replica for vLLM.
        enforce_eager: "true" to skip vLLM's graph compilation.
        engine_args: Any other vLLM engine argument, as a JSON object.
        system_prompt: Added to prompts that do not bring their own system message.
        max_new_tokens: Default for requests without `max_tokens`.
        temperature: Default for requests without `temperature`.
        top_p: Default for requests without `top_p`.
        target_batch_tokens: Token budget per batch (0: the engine's default).
        max_batch_size: Records per batch (0: the engine's default).
        batch_timeout_s: Longest a request waits for its batch to fill.
        model_mismatch: A request whose `body.model` is not the served model: "error" (its line
            fails) or "ignore" (it runs on the served model).
        max_failed_fraction: Share of requests that may fail before the run exits non-zero.
        resume: Reuse chunks finished by an earlier run with the same requests and settings.
    """
    if chunk_size < 1 or max_chunks_in_flight < 1:
        raise ValueError(f"chunk_size and max_chunks_in_flight must be >= 1, got {chunk_size}, {max_chunks_in_flight}")
    if model_mismatch not in ("error", "ignore"):
        raise ValueError(f"model_mismatch must be 'error' or 'ignore', got {model_mismatch!r}")
    # Every engine option of this task's signature goes into the settings (the replica's key).
    settings = EngineSettings.from_options(locals(), resume=resume)
    local_input = Path(await input.download())
    folder = Path(tempfile.mkdtemp(prefix="batch-jsonl-"))
    job = Job(
        local_input,
        folder,
        served_model=model_display_name(model or None),
        model_mismatch=model_mismatch,
        defaults=generation(settings),
    )
    try:
        fanned = await fan_out(
            job.chunks(chunk_size),
            lambda chunk: infer_chunk(chunk, settings),
            job.on_chunk,
            max_in_flight=max_chunks_in_flight,
        )
    finally:
        job.close()
    if not job.counts.done:
        raise ValueError(f"{input.path}: the file has no requests (it is empty, or every line is blank)")
    summary = RunSummary(
        source=str(input.path),
        requests=job.counts.done,
        answered=job.counts.done - job.counts.failed,
        failed=job.counts.failed,
        reused_chunks=job.counts.reused_chunks,
        accuracy=0.0,
        scored=0,
        load_time_s=fanned.load_time_s,
        inference_s=fanned.inference_s,
        requests_per_s=fanned.per_second(job.counts.fresh_answers),
        output_tokens_per_s=fanned.per_second(job.counts.fresh_tokens),
        results=await publish(job.results.path, output_dir),
        errors=await publish(job.errors.path, output_dir),
    )
    await job.progress.finish(final_html(summary, fanned.replicas))
    print(summary_line(summary, "requests"), flush=True)
    check_failures(summary.failed, summary.requests, max_failed_fraction, f"see {summary.errors.path}")
    return summary


class Job:
    """One JSONL job on the driver: reads requests lazily, writes results and errors as they come."""

    def __init__(
        self, input_path: Path, folder: Path, *, served_model: str, model_mismatch: str, defaults: GenerationConfig
    ) -> None:
        self.input_path = input_path
        self.defaults = defaults
        self.served_model = served_model
        self.model_mismatch = model_mismatch
        self.results = JsonLines(folder / "results.jsonl")
        self.errors = JsonLines(folder / "errors.jsonl")
        self.counts = Counts()
        self.progress = Progress(f"Batch job {input_path.name}", total=0)
        self._seen = SeenIds(folder)
        self._in_flight: dict[str, BatchRequest] = {}  # requests of the chunks outstanding, by custom_id
        self._started = time.time()

    async def chunks(self, chunk_size: int) -> AsyncIterator[RequestChunk]:
        """Chunks of valid requests, read from the file as they are needed; bad lines go to the errors file."""
        items: list[RequestItem] = []
        number = 0
        for request in self._requests():
            self._in_flight[request.custom_id] = request
            items.append(to_item(request))
            if len(items) == chunk_size:
                yield RequestChunk(number, items)
                number, items = number + 1, []
                await asyncio.sleep(0)  # let finished chunks write out between reads
        if items:
            yield RequestChunk(number, items)

    def _requests(self) -> Iterator[BatchRequest]:
        with self.input_path.open(encoding="utf-8", errors="replace") as lines:
            for line_number, text in enumerate(lines, start=1):
                if not text.strip():
                    continue
                self.progress.total += 1
                try:
                    request = parse_request_line(
                        text,
                        line_number,
                        served_model=self.served_model,
                        model_mismatch=self.model_mismatch,  # type: ignore[arg-type]
                    )
                    request.generation(self.defaults)  # settings out of range fail the line here, not the chunk
                    first = self._seen.add(request.custom_id, line_number)
                    if first is not None:
                        raise RequestLineError(
                            "duplicate_custom_id",
                            f"custom_id {request.custom_id!r} was already used on line {first}",
                            line=line_number,
                            custom_id=request.custom_id,
                        )
                except RequestLineError as error:
                    self._fail(error)
                    continue
                yield request

    async def on_chunk(self, chunk: RequestChunk, outcome: ChunkOutcome | None, reason: str) -> None:
        reused = outcome is not None and outcome.finished_at < self._started
        for position, item in enumerate(chunk.items):
            request = self._in_flight.pop(item.key)
            result = (
                outcome.results[position]
                if outcome is not None
                else ItemResult(item.key, error_code="inference_failed", error_message=reason)
            )
            if result.error_code:
                failure = RequestLineError(
                    result.error_code, result.error_message, line=request.line, custom_id=request.custom_id
                )
                self._fail(failure)
                continue
            completion = Completion(
                result.text,
                result.prompt_tokens,
                result.completion_tokens,
                result.finish_reason,  # type: ignore[arg-type]
            )
            line = response_line(request, completion, model=self.served_model, request_number=request.line)
            self.results.write(line)
            self.counts.count(failed=False, completion_tokens=result.completion_tokens, fresh=not reused)
        self.counts.reused_chunks += reused
        await self.progress.update(self.counts.done, self.counts.failed)

    def _fail(self, error: RequestLineError) -> None:
        self.errors.write(error_line(error, request_number=error.line))
        self.counts.count(failed=True, completion_tokens=0, fresh=True)

    def close(self) -> None:
        self.results.close()
        self.errors.close()
        self._seen.close()


def to_item(request: BatchRequest) -> RequestItem:
    """The chunk item for a parsed request line (its settings travel with it)."""
    settings: dict[str, Any] = request.settings
    item = RequestItem(
        key=request.custom_id,
        max_tokens=settings.get("max_new_tokens", -1),
        temperature=settings.get("temperature", -1.0),
        top_p=settings.get("top_p", -1.0),
        stop=list(settings.get("stop", ())),
        seed=settings.get("seed", -1),
    )
    if isinstance(request.prompt, str):
        item.prompt = request.prompt
    else:
        item.messages = [ChatMessage(message["role"], message["content"]) for message in request.prompt]
    return item
