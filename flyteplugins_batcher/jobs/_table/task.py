"""The table job: a table in, the same table out with each row's answer, as Ray Data LLM's processors map a dataset.

    flyteplugins-batcher run-table -i questions.parquet -o answers/ --prompt "Answer briefly: {question}"
    flyte run --local workflows/table.py main --input questions.parquet --prompt "Answer briefly: {question}"
    flyte run workflows/table.py main --input s3://bucket/questions/ --output_dir s3://bucket/answers

The driver (`run_table`, or a `TableProcessor` in a task of yours; its code is in
`flyteplugins_batcher/jobs/_table/driver.py`) reads the table a batch at a time (`source.py`
beside it), makes each row's request (`requests.py`), cuts the rows into chunks and fans them out
with `fan_out` to the replicas' tasks, `infer_chunk` (LLM) or `embed_requests` (embeddings), at
most `max_chunks_in_flight` at a time (by default every replica's slots). Each finished chunk
becomes one Parquet part of the output (`parts.py`), published at the end (`publish.py`). A chunk
is what Flyte caches: a rerun after a crash recomputes only the chunks that had not finished, and
sends the rows an earlier run failed to the model again. The run exits non-zero when more rows
failed than `max_failed_fraction` allows, after writing everything.
"""

from __future__ import annotations

from flyte.io import DataFrame

from flyteplugins_batcher.jobs._environments import LLM_SIZING, driver_environment, embed_env, gpu_env
from flyteplugins_batcher.jobs._options import task_with_options
from flyteplugins_batcher.jobs._run_options import RunOptions
from flyteplugins_batcher.jobs._summary import RunSummary
from flyteplugins_batcher.jobs._table.options import TableOptions
from flyteplugins_batcher.replica import EngineSettings

table_driver_env = driver_environment("batch_table_driver", gpu_env, embed_env)


@task_with_options(table_driver_env, report=True)
async def run_table(
    input: DataFrame | str,
    rows: TableOptions = TableOptions(),
    run: RunOptions = RunOptions(chunk_size=LLM_SIZING.chunk_size),
    settings: EngineSettings = EngineSettings(),
) -> RunSummary:
    """Answer every row of a table with an LLM (or embed it); write the table with each row's answer.

    Args:
        input: The table: a Parquet, CSV or JSONL file or folder (local, or s3://, gs://, ...), a Hugging
            Face dataset saved with save_to_disk (PATH, or PATH:SPLIT) or named on the Hub (NAME[:CONFIG]:SPLIT),
            or a flyte.io.DataFrame.
        rows: What each row asks, and where its answer goes.
        run: How the job is chunked, resumed and written (output_dir: where the output Parquet dataset goes).
        settings: The engine, generation and batcher settings (a row's own settings win).
    """
    from flyteplugins_batcher.jobs._table.driver import run_table_job  # Arrow's: the replicas' images have none

    return await run_table_job(input, rows, run, settings)
