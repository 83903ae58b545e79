"""The table job end to end through flyte's local runner, on the simulated engine: rows in, rows out, in order.

The simulated engine answers every prompt with `max_new_tokens` tokens of filler (its answers are
longer than that), tokenizes at 4 characters a token, and has the context given here: what a row
gets back is known, so each row's columns can be checked.
"""

from __future__ import annotations

import json
import pickle
import re
import uuid
from pathlib import Path

import cloudpickle
import flyte
import flyte.errors
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flyte.io import DataFrame

from flyteplugins_batcher.jobs import RunOptions, RunSummary, TableProcessor, gpu_env, run_table
from flyteplugins_batcher.replica import EngineSettings
from tests.jobs import table_hooks
from tests.jobs.conftest import CountingBatcher

CONTEXT = 512
SIMULATED = {
    "engine": "simulated",
    "engine_args": json.dumps({"time_scale": 50, "gpu": {"max_model_len": CONTEXT}}),
    "max_new_tokens": 8,
}
COLUMNS = ["generated_text", "num_input_tokens", "num_generated_tokens", "error"]


def questions(tmp_path: Path, count: int, **columns: list) -> tuple[pa.Table, str]:
    """A Parquet file of `count` questions no earlier run has asked (in row groups of 3), and its table."""
    marker = uuid.uuid4().hex[:8]
    table = pa.table({"question": [f"Question {n} ({marker})?" for n in range(count)], **columns})
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "questions.parquet"
    pq.write_table(table, path, row_group_size=3)
    return table, str(path)


def test_each_row_comes_back_in_order_with_its_columns_its_answer_and_its_own_error(run_locally, tmp_path: Path):
    nested = [{"id": n, "tags": [f"t{n}", "x"][: n % 3], "score": {"a": n / 4}} for n in range(10)]
    table, _ = questions(tmp_path, 10, meta=nested, n=list(range(10)))
    asked = table.column("question").to_pylist()
    asked[3], asked[6] = None, "word " * 700  # a null field; a prompt longer than the context
    table = table.set_column(0, "question", pa.array(asked))
    pq.write_table(table, tmp_path / "questions.parquet", row_group_size=3)

    summary: RunSummary = run_locally(
        run_table, input=str(tmp_path / "questions.parquet"), prompt="Answer briefly: {question}",
        output_dir=str(tmp_path / "out"), chunk_size=3, max_failed_fraction=0.5, order="file", **SIMULATED,
    )  # fmt: skip

    out = pq.read_table(tmp_path / "out")
    assert out.column_names == ["question", "meta", "n", *COLUMNS]
    assert out.select(["question", "meta", "n"]).equals(table)  # every input column as it was, in input order
    errors = out.column("error").to_pylist()
    assert errors[3] == "null_value: column 'question' is null"
    assert errors[6].startswith("context_length_exceeded: ")
    assert [error is None for error in errors] == [n not in (3, 6) for n in range(10)]
    answered = [row for row in out.to_pylist() if row["error"] is None]
    assert all(row["generated_text"] and row["num_generated_tokens"] == 8 for row in answered)
    assert all(row["num_input_tokens"] > len("Answer briefly: Question 0 (12345678)?") // 4 for row in answered)
    assert out.column("generated_text")[3].as_py() is None and out.column("num_input_tokens")[6].as_py() is None
    assert (summary.requests, summary.answered, summary.failed, summary.reused) == (10, 8, 2, 0)
    assert summary.output.uri == str(tmp_path / "out")
    assert pd.read_parquet(summary.output.uri)["n"].tolist() == list(range(10))  # pandas reads it whole too
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [f"part-{n:09d}.parquet" for n in range(4)]


def test_a_template_naming_a_missing_column_fails_each_row_alone_and_the_run_exits_non_zero(run_locally, tmp_path):
    table, path = questions(tmp_path, 3)
    message = "3 of 3 rows failed (100.0%, allowed: 0.0%); first: row 0: missing_column: the row has no column 'topic'"
    with pytest.raises(flyte.errors.RuntimeUserError, match=re.escape(message)):
        run_locally(run_table, input=path, prompt="{topic}: {question}", output_dir=str(tmp_path / "out"), **SIMULATED)

    out = pq.read_table(tmp_path / "out")  # written before the run failed
    assert out.column("question").equals(table.column("question"))
    assert set(out.column("error").to_pylist()) == {"missing_column: the row has no column 'topic' (it has 'question')"}


def test_a_rows_own_settings_win_and_bad_ones_fail_that_row_alone(run_locally, tmp_path: Path):
    asked = ["short", "long", "too hot", "boom", "refuse", "default"]
    table = pa.table({"question": asked, "budget": [2, 5, None, None, None, None]})
    pq.write_table(table, tmp_path / "rows.parquet")

    run_locally(
        run_table, input=str(tmp_path / "rows.parquet"), preprocess="tests.jobs.table_hooks:ask",
        postprocess="tests.jobs.table_hooks:words", output_dir=str(tmp_path / "out"), max_failed_fraction=1.0,
        **SIMULATED,
    )  # fmt: skip

    rows = {row["question"]: row for row in pq.read_table(tmp_path / "out").to_pylist()}
    assert list(rows) == asked  # the postprocess changed no input column
    assert [rows[name]["num_generated_tokens"] for name in ("short", "long", "default")] == [2, 5, 8]
    assert rows["too hot"]["error"] == "invalid_request: temperature must be from 0 to 2, got 5"
    assert rows["boom"]["error"] == "preprocess_failed: KeyError: 'no such thing'"
    assert rows["refuse"]["error"] == "postprocess_failed: ValueError: cannot count these"
    assert rows["refuse"]["generated_text"] and rows["refuse"]["words"] is None  # its answer kept, not its columns
    assert [rows[name]["words"] for name in ("short", "long")] == [
        len(rows[name]["generated_text"].split()) for name in ("short", "long")
    ]
    assert rows["long"]["tokens"] == 5 and rows["default"]["error"] is None


def test_a_rerun_after_a_crash_sends_only_the_unfinished_chunks(cached_run, tmp_path: Path):
    table, path = questions(tmp_path, 12)
    job = {"input": path, "prompt": "{question}", "chunk_size": 3, "output_dir": str(tmp_path / "out"), **SIMULATED}
    job["order"] = "file"  # the chunks are row ranges: the last one holds the row that crashed
    crashing = CountingBatcher(fail_when=lambda text: "Question 10 " in text)
    cached_run(run_table, crashing, fails="3 of 12 rows failed", **job)

    healthy = CountingBatcher()
    summary: RunSummary = cached_run(run_table, healthy, **job)

    assert (summary.answered, summary.failed, summary.reused, summary.retried) == (12, 0, 9, 0)
    assert sorted(healthy.prompts) == sorted(table.column("question").to_pylist()[9:])  # the one unfinished chunk
    assert pq.read_table(summary.output.uri).column("question").equals(table.column("question"))


def test_a_rerun_sends_a_row_that_failed_alone_again_and_reuses_the_rest(cached_run, tmp_path: Path):
    table, path = questions(tmp_path, 6)
    job = {"input": path, "prompt": "{question}", "chunk_size": 3, **SIMULATED}
    refusing = CountingBatcher(refuse_when=lambda text: "Question 4 " in text)  # say, xgrammar was missing
    cached_run(run_table, refusing, fails="1 of 6 rows failed", **job)

    fixed = CountingBatcher()
    summary: RunSummary = cached_run(run_table, fixed, **job)

    assert fixed.prompts == [table.column("question")[4].as_py()]
    assert (summary.answered, summary.failed, summary.reused, summary.retried) == (6, 0, 5, 1)
    assert pq.read_table(summary.output.uri).column("error").null_count == 6


def test_the_input_columns_may_not_be_named_as_the_columns_the_job_adds(run_locally, tmp_path: Path):
    _, path = questions(tmp_path, 2, error=["a", "b"])
    with pytest.raises(flyte.errors.RuntimeUserError, match=r"already has the column\(s\) error"):
        run_locally(run_table, input=path, prompt="{question}", output_dir=str(tmp_path / "out"), **SIMULATED)
    assert not list((tmp_path / "out").iterdir())  # refused before anything ran


def test_an_output_folder_holding_other_files_is_refused_before_anything_runs(run_locally, tmp_path: Path):
    _, path = questions(tmp_path, 2)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(flyte.errors.RuntimeUserError, match=r"holds files that are not this job's parts \(notes.txt\)"):
        run_locally(run_table, input=path, prompt="{question}", output_dir=str(tmp_path / "out"), **SIMULATED)


def test_a_second_run_into_the_same_folder_replaces_the_first_runs_parts(run_locally, tmp_path: Path):
    _, longer = questions(tmp_path / "a", 9)
    table, shorter = questions(tmp_path / "b", 4)
    for path in (longer, shorter):
        run_locally(
            run_table, input=path, prompt="{question}", chunk_size=3, output_dir=str(tmp_path / "out"), **SIMULATED
        )
    assert pq.read_table(tmp_path / "out").column("question").equals(table.column("question"))


# -- the processor in a task of your own ---------------------------------------------------------------------------

processor = TableProcessor(
    prompt="Say something about {word}.",
    postprocess=table_hooks.words,
    settings=EngineSettings(**SIMULATED),
    run=RunOptions(chunk_size=2),
)
own_env = flyte.TaskEnvironment("table_processor_test", depends_on=processor.replicas)


@own_env.task
async def words() -> DataFrame:
    return DataFrame.wrap_df(
        pd.DataFrame({"word": [f"w{n}-{uuid.uuid4().hex[:6]}" for n in range(5)], "question": ["q"] * 5})
    )


@own_env.task
async def answer(table: DataFrame) -> DataFrame:
    return await processor(table)


@own_env.task
async def count_words(answered: DataFrame) -> list[str]:
    frame = await answered.open(pd.DataFrame).all()
    return [f"{row.words} {len(row.generated_text.split())} {row.question}" for row in frame.itertuples()]


@own_env.task
async def pipeline() -> list[str]:
    return await count_words(await answer(await words()))


def test_a_processor_maps_a_dataframe_in_a_task_of_your_own_for_the_next_task(run_locally):
    counted = run_locally(pipeline)

    assert len(counted) == 5  # every row, its postprocess's column beside its answer, its own columns unchanged
    assert all(
        words == answer_words != "0" and question == "q" for words, answer_words, question in map(str.split, counted)
    )
    assert processor.replicas == [gpu_env]


def test_a_processor_pickles_with_its_functions():
    again = pickle.loads(pickle.dumps(processor))
    assert again == processor and again.postprocess is table_hooks.words
    with_lambda = TableProcessor(preprocess=lambda row: {"prompt": row["text"]})
    assert cloudpickle.loads(cloudpickle.dumps(with_lambda)).preprocess({"text": "hi"}) == {"prompt": "hi"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "give exactly one of prompt, messages_column, column or preprocess .got none."),
        ({"prompt": "{q}", "column": "q"}, "got prompt and column"),
        ({"task_type": "rank"}, "task_type must be one of generate, embed, score, classify, got 'rank'"),
        ({"task_type": "embed"}, "needs the column to embed"),
        ({"task_type": "classify"}, "needs the column to classify"),
        ({"task_type": "score", "query_column": "q"}, "needs the columns of each row's pair: query_column and"),
        ({"prompt": "{q}", "response_format": "{not json"}, "response_format is not JSON"),
    ],
)
def test_a_processor_refuses_options_that_cannot_work_when_it_is_built(options: dict, message: str):
    with pytest.raises(ValueError, match=message):
        TableProcessor(**options)


def test_the_driver_reads_the_table_as_chunks_are_taken_not_all_at_once(tmp_path: Path):
    import asyncio

    from flyteplugins_batcher.engines import GenerationConfig
    from flyteplugins_batcher.jobs._table.job import TableJob
    from flyteplugins_batcher.jobs._table.options import TableOptions
    from flyteplugins_batcher.jobs._table.parts import TableParts
    from flyteplugins_batcher.jobs._table.requests import RowRequests
    from flyteplugins_batcher.jobs._table.source import TableSource

    read: list[int] = []

    def batches(rows: int):
        for number in range(100):  # 1,000 rows in batches of 10
            read.append(number)
            yield pa.record_batch([[f"q{number}-{row}" for row in range(10)]], names=["question"])

    options = TableOptions(prompt="{question}")
    source = TableSource("counted", pa.schema([("question", pa.string())]), None, batches)
    requests = RowRequests(options, None, GenerationConfig())
    parts = TableParts(tmp_path, options, ["question"], None)
    job = TableJob(source, requests, parts, chunk_size=4, order="file")

    async def take(job: TableJob, count: int) -> list:
        chunks = job.chunks()
        taken = [await anext(chunks) for _ in range(count)]
        await chunks.aclose()
        return taken

    taken = asyncio.run(take(job, 3))
    assert [[item.key for item in chunk.items] for chunk in taken][2] == ["row-8", "row-9", "row-10", "row-11"]
    assert read == [0, 1] and job.progress.total == 12  # two batches read for three chunks, not the table

    read.clear()
    placed = TableJob(source, requests, parts, chunk_size=4, order="prefix", window=16)
    asyncio.run(take(placed, 3))
    assert read == [0, 1] and placed.progress.total == 16  # one window of 16 rows read, not the table


def test_a_column_only_later_chunks_add_is_null_in_the_earlier_rows_and_the_parts_read_as_one(
    run_locally, tmp_path: Path
):
    _, path = questions(tmp_path, 9, n=list(range(9)))

    run_locally(
        run_table, input=path, prompt="{question}", output_dir=str(tmp_path / "out"), chunk_size=3,
        postprocess="tests.jobs.table_hooks:late_column", order="file", **SIMULATED,
    )  # fmt: skip

    out = pq.read_table(tmp_path / "out")
    assert out.column_names == ["question", "n", *COLUMNS[:-1], "late", "error"]
    assert out.column("late").to_pylist() == [None, None, None, *(n * 10 for n in range(3, 9))]
    schemas = [pq.read_schema(part) for part in sorted((tmp_path / "out").iterdir())]
    assert len(schemas) == 3 and all(schema.equals(schemas[0]) for schema in schemas)
