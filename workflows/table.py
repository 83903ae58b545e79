"""A table in, the same table out with each row's answer: the table job, and a processor in tasks of your own.

flyte run --local workflows/table.py main --input questions.parquet --prompt "Answer briefly: {question}"
flyte run --local workflows/table.py pipeline
flyte deploy workflows/table.py driver_env   # or env: the tasks below, with the LLM replicas they call

The job without Flyte's CLI: `flyteplugins-batcher run-table -i questions.parquet -o out/ --prompt "..."`.
"""

import flyte
import pandas as pd
from flyte.io import DataFrame

from flyteplugins_batcher.images import DRIVER_SPEC
from flyteplugins_batcher.jobs import TableProcessor
from flyteplugins_batcher.jobs import run_table as main
from flyteplugins_batcher.jobs import table_driver_env as driver_env
from flyteplugins_batcher.replica import EngineSettings


def words(row: dict) -> dict:
    """Columns to add to a row, from its answer (Ray Data LLM's `postprocess`)."""
    return {"answer_words": len(row["generated_text"].split())}


# Built once from settings and functions; it pickles, so `flyte deploy` can version this module.
processor = TableProcessor(
    prompt="Answer briefly: {question}",
    postprocess=words,
    settings=EngineSettings(max_new_tokens=64),
)
env = flyte.TaskEnvironment("table_example", image=DRIVER_SPEC.resolve(), depends_on=processor.replicas)


@env.task
async def questions() -> DataFrame:
    frame = pd.DataFrame({"question": ["What is 2 + 2?", "Name a prime number.", "What color is the sky?"]})
    return DataFrame.wrap_df(frame)


@env.task
async def answer(table: DataFrame) -> DataFrame:
    return await processor(table)  # every row fanned out to the LLM replicas, as `main` does


@env.task
async def pipeline() -> DataFrame:
    return await answer(await questions())


__all__ = ["answer", "driver_env", "env", "main", "pipeline", "processor", "questions", "words"]
