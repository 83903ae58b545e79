"""Ready-made Flyte jobs: batch inference on reusable GPU replicas, driven by a task that fans chunks out.

Three jobs, each a driver task with its environment, and the replica tasks they call:

- `run_batch_file` (environment `jsonl_driver_env`): an OpenAI-batch JSONL file in, `results.jsonl`
  and `errors.jsonl` out, as `vllm run-batch` takes it. `flyteplugins-batcher run-batch` runs it.
- `solve_gsm8k` (`gsm8k_driver_env`): gsm8k with batched LLM inference, scored; throughput,
  occupancy and accuracy in its report.
- `embed_corpus` (`embed_driver_env`): a corpus embedded into one Parquet file.

The replicas are process-level singletons on reusable containers: `gpu_env` runs `infer_chunk`
(one engine and one shared `TokenBatcher` per process, `LLMReplica`), `embed_env` runs
`embed_chunk` and `embed_requests` (one `@batched` embedding model per process). Their sizes come
from `BATCH_LLM_*` and `EMBED_*` variables, read when this package is imported.

The machinery is public too, for jobs of your own: `fan_out` (bounded chunks in flight, failures
per chunk), `retrying_reused_failures` (reruns), `Job` (a JSONL file read lazily), `Progress`
(the progress line and the live report), `task_with_options` (option dataclasses as task inputs).

Example:
    ```python
    import flyte
    from flyte.io import File
    from flyteplugins_batcher.jobs import run_batch_file

    flyte.init()
    run = flyte.with_runcontext(mode="local").run(run_batch_file, input=File.from_local("requests.jsonl"))
    print(run.outputs())
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.jobs._batch_jsonl import OUTPUT_FILES as BATCH_OUTPUT_FILES
from flyteplugins_batcher.jobs._batch_jsonl import driver_env as jsonl_driver_env
from flyteplugins_batcher.jobs._batch_jsonl import main as run_batch_file
from flyteplugins_batcher.jobs._batch_llm import driver_env as gsm8k_driver_env
from flyteplugins_batcher.jobs._batch_llm import main as solve_gsm8k
from flyteplugins_batcher.jobs._driver import (
    Counts,
    FanOutStats,
    JsonLines,
    RunOptions,
    UnrecoverableRunError,
    check_failures,
    fan_out,
    finish_run,
)
from flyteplugins_batcher.jobs._embed import EmbedSummary
from flyteplugins_batcher.jobs._embed import driver_env as embed_driver_env
from flyteplugins_batcher.jobs._embed import main as embed_corpus
from flyteplugins_batcher.jobs._embed_replica import EMBED_POOL, embed_chunk, embed_env, embed_requests
from flyteplugins_batcher.jobs._environments import ReplicaPool, driver_environment
from flyteplugins_batcher.jobs._jsonl_job import Job
from flyteplugins_batcher.jobs._llm_replica import (
    LLM_POOL,
    LLM_SIZING,
    LLMReplica,
    gpu_env,
    infer_chunk,
    load_engine,
    process_replica,
    run_chunk,
    set_process_replica,
)
from flyteplugins_batcher.jobs._options import task_with_options
from flyteplugins_batcher.jobs._outputs import Destination, OutputDirError, WorkFolder
from flyteplugins_batcher.jobs._report import Progress
from flyteplugins_batcher.jobs._reruns import retrying_reused_failures
from flyteplugins_batcher.jobs._schema import (
    ChatMessage,
    ChunkOutcome,
    EngineSettings,
    ItemResult,
    ReplicaSnapshot,
    RequestChunk,
    RequestItem,
    RunSummary,
)

__all__ = [
    "BATCH_OUTPUT_FILES",
    "EMBED_POOL",
    "LLM_POOL",
    "LLM_SIZING",
    "ChatMessage",
    "ChunkOutcome",
    "Counts",
    "Destination",
    "EmbedSummary",
    "EngineSettings",
    "FanOutStats",
    "ItemResult",
    "Job",
    "JsonLines",
    "LLMReplica",
    "OutputDirError",
    "Progress",
    "ReplicaPool",
    "ReplicaSnapshot",
    "RequestChunk",
    "RequestItem",
    "RunOptions",
    "RunSummary",
    "UnrecoverableRunError",
    "WorkFolder",
    "check_failures",
    "driver_environment",
    "embed_chunk",
    "embed_corpus",
    "embed_driver_env",
    "embed_env",
    "embed_requests",
    "fan_out",
    "finish_run",
    "gpu_env",
    "gsm8k_driver_env",
    "infer_chunk",
    "jsonl_driver_env",
    "load_engine",
    "process_replica",
    "retrying_reused_failures",
    "run_batch_file",
    "run_chunk",
    "set_process_replica",
    "solve_gsm8k",
    "task_with_options",
]
