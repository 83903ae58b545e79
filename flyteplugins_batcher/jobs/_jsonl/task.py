"""Batch jobs on your own data: an OpenAI-batch (or plain) JSONL file in, results and errors out.

    flyte run --local workflows/batch_jsonl.py main --input requests.jsonl
    flyte run workflows/batch_jsonl.py main --input s3://bucket/requests.jsonl --output_dir s3://bucket/out

Each input line is a request (`flyteplugins_batcher.batch_api` says what is accepted); a bad line
fails alone, with a line in the errors file naming its code and the reason, and every other line
still runs. Chat and completion lines run on the LLM replicas (`infer_chunk`), embedding lines on
the embedding replicas (`embed_requests`); a file may mix them, and a run loads only the models its
lines need. The driver streams the file (`flyteplugins_batcher/jobs/_jsonl/job.py`): it parses a line at a time,
keeps at most `max_chunks_in_flight` chunks outstanding (by default every LLM replica's slots:
replicas x concurrency, sized to the engine by `size_in_flight`), and writes results as chunks
finish, so its memory does not grow with the file. Finished chunks are cached by content and settings:
re-running a job after a crash recomputes only what had not finished.

As `vllm run-batch`, the run succeeds once every line is answered or failed in its own line (an empty
file is an empty result); `max_failed_fraction` is the opt-in guard that fails it past a share of
failed lines, after writing everything that did finish. `output_file` writes `vllm run-batch`'s one
output file (every line's result or error, in input order) instead of the results and errors files.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from flyte.io import File

from flyteplugins_batcher.engines import EmbeddingModel
from flyteplugins_batcher.jobs._driver import fan_out
from flyteplugins_batcher.jobs._environments import LLM_POOL, LLM_SIZING, driver_environment, embed_env, gpu_env
from flyteplugins_batcher.jobs._finish import finish_run
from flyteplugins_batcher.jobs._journal import JournalWriter
from flyteplugins_batcher.jobs._jsonl.job import Job
from flyteplugins_batcher.jobs._jsonl.outputs import SPLIT_FILES
from flyteplugins_batcher.jobs._options import task_with_options
from flyteplugins_batcher.jobs._outputs import Destination, OutputDirError, WorkFolder
from flyteplugins_batcher.jobs._replica_tasks import embed_requests, infer_chunk, pool_chunk
from flyteplugins_batcher.jobs._reruns import retrying_reused_failures
from flyteplugins_batcher.jobs._run_options import RunOptions
from flyteplugins_batcher.jobs._summary import RunSummary
from flyteplugins_batcher.replica import EmbeddingChunk, EngineSettings, JobChunk, JobOutcome

jsonl_driver_env = driver_environment("batch_jsonl_driver", gpu_env, embed_env)


@task_with_options(jsonl_driver_env, report=True)
async def run_batch_file(
    input: File,
    model_mismatch: str = "error",
    served_model_name: str = "",
    embedding_chunk_size: int = 128,
    journal: str = "",
    output_file: str = "",
    run: RunOptions = RunOptions(chunk_size=LLM_SIZING.chunk_size, max_failed_fraction=None),
    settings: EngineSettings = EngineSettings(),
) -> RunSummary:
    """Run every request of a JSONL file; write OpenAI-batch result lines and error lines.

    Args:
        input: The requests, one JSON object per line (OpenAI batch lines, or plain
            `{"custom_id"?, "prompt" | "messages"}` lines).
        model_mismatch: A request whose `body.model` names none of the served models or adapters: "error"
            (its line fails, listing them) or "ignore" (it runs on the first model). A model answers to its
            reference as given, to its short name (a path's last part), and (the first) to served_model_name;
            the embedding model (EMBED_MODEL) to its reference as given and its short name.
        served_model_name: The model's name in result lines, also accepted in requests (vLLM's
            --served-model-name); empty: the model's reference as given (`--model`, as vLLM echoes it). With
            several models, the first one's.
        embedding_chunk_size: Texts per chunk of embedding requests (a request's texts stay together).
        journal: Also write every finished line, as the run goes, to this folder or object-store prefix
            (numbered segments, for a follower such as the Batch API server); empty: no journal.
        output_file: Write `vllm run-batch`'s one output file here instead: every line's result or error line,
            in input order (a local path, a file:// URI or a remote URI); empty: results.jsonl and errors.jsonl
            in output_dir. Not both.
        run: How the job is chunked, resumed and written.
        settings: The engine, generation and batcher settings (a request's own settings win).
    """
    if model_mismatch not in ("error", "ignore"):
        raise ValueError(f"model_mismatch must be 'error' or 'ignore', got {model_mismatch!r}")
    settings.served_models(served_model_name)  # models and adapters that cannot be told apart fail here, at once
    destination, single_file = _destination(run.output_dir, output_file)  # before any inference
    local_input = Path(await input.download())
    work = WorkFolder("batch-jsonl-", destination)
    job = _job(local_input, work.path, settings, served_model_name, model_mismatch, journal, run, single_file)
    fanned = None
    try:
        fanned = await fan_out(
            job.chunks(run.chunk_size, embedding_chunk_size),
            retrying_reused_failures(_replicas(job, settings), salt=run.cache_salt(), started=job.started),
            job.on_chunk,
            max_in_flight=run.chunks_in_flight(LLM_POOL),
            phase=job.lanes.phase if job.lanes.several else None,
        )
    finally:
        job.close()
        await job.close_journal()
        if fanned is None:
            work.discard()  # the run failed as a whole; its error says why
    results, errors = job.outputs.files()
    return await finish_run(
        source=str(input.path),
        counts=job.counts,
        fanned=fanned,
        work=work,
        results=results,
        errors=errors,
        run=run,
        pool=LLM_POOL,
        progress=job.progress,
        models=job.lanes.runs(fanned.model_loads, fanned.wall_s),
    )


def _job(
    local_input: Path,
    folder: Path,
    settings: EngineSettings,
    served_model_name: str,
    model_mismatch: str,
    journal: str,
    run: RunOptions,
    output_file: str,
) -> Job:
    """The job over a local copy of the file, its first model answering to `served_model_name` too."""
    embedding = EmbeddingModel()
    return Job(
        local_input,
        folder,
        settings,
        served_model_name=served_model_name,
        served_embedding_model=embedding.name,
        embedding_tasks=embedding.tasks,
        model_mismatch=model_mismatch,  # type: ignore[arg-type]
        journal=JournalWriter(journal) if journal else None,
        order=run.order,
        window=run.order_window,
        output_file=output_file,
    )


def _destination(output_dir: str, output_file: str) -> tuple[Destination, str]:
    """Where the run's files go, checked now, and the name of its one output file (empty: the two files).

    Raises:
        OutputDirError: The folder or the file's folder cannot receive them, or both are given.
    """
    if not output_file.strip():
        return Destination.check(output_dir, SPLIT_FILES), ""
    if output_dir.strip():
        raise OutputDirError(f"give output_dir ({output_dir!r}) or output_file ({output_file!r}), not both")
    return Destination.for_file(output_file)


def _replicas(job: Job, settings: EngineSettings) -> Callable[[JobChunk, str], Awaitable[JobOutcome]]:
    """Where the job's chunks run: embeddings on the embedding replicas, the rest on the LLM replicas, with their
    model's settings."""

    def infer(chunk: JobChunk, cache_salt: str) -> Awaitable[JobOutcome]:
        if isinstance(chunk, EmbeddingChunk) and chunk.model:
            return pool_chunk(chunk, settings, cache_salt)  # the classifier given as the model
        if isinstance(chunk, EmbeddingChunk):
            return embed_requests(chunk, job.served_embedding_model, cache_salt)
        return infer_chunk(chunk, job.lanes.settings(chunk, settings), cache_salt)

    return infer
