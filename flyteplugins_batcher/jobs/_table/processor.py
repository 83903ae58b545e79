"""`TableProcessor`: the table job as a Python object, called on a table inside a Flyte task of your own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import flyte
from flyte.io import DataFrame

from flyteplugins_batcher.jobs._environments import LLM_SIZING, embed_env, gpu_env
from flyteplugins_batcher.jobs._run_options import RunOptions
from flyteplugins_batcher.jobs._summary import RunSummary
from flyteplugins_batcher.jobs._table.options import RowFunction, TableOptions
from flyteplugins_batcher.replica import EngineSettings


@dataclass(frozen=True)
class TableProcessor(TableOptions):
    """Batch LLM inference (or embeddings) over a table, in a Flyte task of your own: build it once, call it on tables.

    What Ray Data LLM's `build_processor(config, preprocess=..., postprocess=...)` makes, on
    Flyte's replicas: `await processor(table)` runs `run_table`'s driver in your task and returns
    the table with each row's answer, as a `flyte.io.DataFrame` (a Parquet dataset). The table is a
    `flyte.io.DataFrame`, a path or URI, or a pandas/polars DataFrame or pyarrow Table in memory.
    Chunks go to the LLM replicas (`gpu_env`, task `infer_chunk`) or the embedding replicas
    (`embed_env`), so your task's environment depends on them: `depends_on=processor.replicas`.

    Its other fields are `run_table`'s inputs of those names (`task_type`, `prompt`, `messages_column`,
    `column`, `output_column`, `response_format`, `embedding_chunk_size`). A processor pickles
    (with module-level functions, or lambdas through cloudpickle), so `flyte deploy` can version
    a module that holds one.

    Attributes:
        preprocess: A function from a row (a dict) to its request, `{"messages": [...]}` or
            `{"prompt": "..."}` with settings of its own (`max_tokens`, `temperature`, ...; Ray's
            `sampling_params` too); or "module:function".
        postprocess: A function from a row with its answer (`generated_text`, `num_input_tokens`,
            `num_generated_tokens`) to the columns to add; or "module:function".
        response_format: A JSON schema (a dict, or its JSON text): the answer column is a struct built from it.
        settings: The engine, generation and batcher settings (a row's own settings win).
        run: How the job is chunked, resumed and written (`output_dir`: where the output goes; empty: the
            run's own storage).

    Example:
        ```python
        processor = TableProcessor(
            prompt="Answer briefly: {question}",
            postprocess=lambda row: {"words": len(row["generated_text"].split())},
            settings=EngineSettings(max_new_tokens=64),
        )
        env = flyte.TaskEnvironment("answers", image=DRIVER_SPEC.resolve(), depends_on=processor.replicas)


        @env.task
        async def answer(questions: flyte.io.DataFrame) -> flyte.io.DataFrame:
            return await processor(questions)
        ```
    """

    preprocess: RowFunction | str = ""
    postprocess: RowFunction | str = ""
    response_format: str | Mapping[str, Any] = ""
    settings: EngineSettings = EngineSettings()
    run: RunOptions = RunOptions(chunk_size=LLM_SIZING.chunk_size)

    def __post_init__(self) -> None:
        self.check()
        self.schema()

    @property
    def replicas(self) -> list[flyte.TaskEnvironment]:
        """The replicas' environments this processor sends chunks to: your task's environment depends on them."""
        if self.task_type == "embed":
            return [embed_env]
        return [embed_env, gpu_env] if self.encoder else [gpu_env]  # a score or classify: a classifier is the LLM's

    async def __call__(self, table: Any) -> DataFrame:
        """The table with each row's answer (every input column, the answer, token counts, `error`), in row order.

        Raises:
            ValueError: A table that cannot be read, or options that cannot work (before any inference).
            RuntimeError: More rows failed than `run.max_failed_fraction` allows (after writing everything).
        """
        return (await self.process(table)).output

    async def process(self, table: Any) -> RunSummary:
        """What `__call__` does, returning the run's summary (counts, throughput, and the output as `output`)."""
        from flyteplugins_batcher.jobs._table.driver import run_table_job  # Arrow's: the replicas' images have none

        return await run_table_job(table, self, self.run, self.settings)
