"""Ready-made Flyte jobs: batch inference on reusable GPU replicas, driven by a task that fans chunks out.

Four jobs, each a driver task with its environment, and the replica tasks they call:

- `run_table` (environment `table_driver_env`): a table in (Parquet, CSV, JSONL, a Hugging Face
  dataset, a `flyte.io.DataFrame`), the same table out with each row's answer (or embedding), as
  Ray Data LLM's processors map a dataset. `flyteplugins-batcher run-table` runs it;
  `TableProcessor` runs it inside a task of yours.
- `run_batch_file` (`jsonl_driver_env`): an OpenAI-batch JSONL file in, `results.jsonl` and
  `errors.jsonl` out, as `vllm run-batch` takes it. `flyteplugins-batcher run-batch` runs it.
- `solve_gsm8k` (`gsm8k_driver_env`): gsm8k with batched LLM inference, scored; throughput,
  occupancy and accuracy in its report.
- `embed_corpus` (`table_driver_env`): a corpus embedded into Parquet, the table job's embeddings.

The replica tasks run on reusable containers: `gpu_env` runs `infer_chunk` (on this process's
`LLMReplica`: one engine and one shared `TokenBatcher`), `embed_env` runs `embed_requests` (on this
process's `EmbeddingReplica`; both in `flyteplugins_batcher.replica`). Their sizes come from
`BATCH_LLM_*` and `EMBED_*` variables, read when this package is imported.

The machinery is public too, for jobs of your own: `fan_out` (bounded chunks in flight, failures
per chunk), `retrying_reused_failures` (reruns), `Progress` (the progress line and the live
report), `read_journal_segment` (a run's finished lines as it goes, for a follower such as the
Batch API server), and `DeclaredOption` (an option as a dataclass field or a task input declares it,
with its help: what the command line's flags and the server's variables are read from).

Example:
    ```python
    import flyte
    from flyteplugins_batcher.jobs import run_table

    flyte.init()
    run = flyte.with_runcontext(mode="local").run(
        run_table, input="questions.parquet", prompt="Answer briefly: {question}", output_dir="answers/"
    )
    print(run.outputs())
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.jobs._corpus.job import embed_corpus
from flyteplugins_batcher.jobs._driver import UnrecoverableRunError, fan_out
from flyteplugins_batcher.jobs._environments import embed_env, gpu_env
from flyteplugins_batcher.jobs._gsm8k.job import gsm8k_driver_env, solve_gsm8k
from flyteplugins_batcher.jobs._journal import read_journal_segment
from flyteplugins_batcher.jobs._jsonl.task import jsonl_driver_env, run_batch_file
from flyteplugins_batcher.jobs._options import DeclaredOption
from flyteplugins_batcher.jobs._replica_tasks import embed_requests, infer_chunk
from flyteplugins_batcher.jobs._report import Progress
from flyteplugins_batcher.jobs._reruns import retrying_reused_failures
from flyteplugins_batcher.jobs._run_options import RunOptions
from flyteplugins_batcher.jobs._summary import RunSummary
from flyteplugins_batcher.jobs._table.processor import TableProcessor
from flyteplugins_batcher.jobs._table.task import run_table, table_driver_env

__all__ = [
    "DeclaredOption",
    "Progress",
    "RunOptions",
    "RunSummary",
    "TableProcessor",
    "UnrecoverableRunError",
    "embed_corpus",
    "embed_env",
    "embed_requests",
    "fan_out",
    "gpu_env",
    "gsm8k_driver_env",
    "infer_chunk",
    "jsonl_driver_env",
    "read_journal_segment",
    "retrying_reused_failures",
    "run_batch_file",
    "run_table",
    "solve_gsm8k",
    "table_driver_env",
]
