"""Every kind of table the job reads, end to end on the simulated engine: the rows come back in order, as they were."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import datasets
import flyte
import flyte.errors
import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flyte.io import DataFrame

from flyteplugins_batcher.jobs import RunOptions, RunSummary, TableProcessor, run_table, table_driver_env
from flyteplugins_batcher.replica import EngineSettings
from tests.jobs.test_table import SIMULATED


def asked(count: int) -> list[str]:
    marker = uuid.uuid4().hex[:8]  # questions no earlier run has asked
    return [f"Question {n} ({marker})?" for n in range(count)]


def answered(run_locally, table: object, tmp_path: Path, **options: object) -> pa.Table:
    """The output of the job on `table` (a path, a URI, a Hub name), every row answered."""
    summary: RunSummary = run_locally(
        run_table, input=table, prompt="{question}", output_dir=str(tmp_path / "out"), chunk_size=2,
        **SIMULATED | options,
    )  # fmt: skip
    out = pq.read_table(summary.output.uri)
    assert out.column("error").null_count == out.num_rows == summary.requests == summary.answered
    return out


def test_a_folder_of_parquet_files_is_read_in_name_order(run_locally, tmp_path: Path):
    questions = asked(7)
    folder = tmp_path / "questions"
    folder.mkdir()
    for name, rows in (("b", questions[:3]), ("a", questions[3:5]), ("c", questions[5:])):  # written out of order
        pq.write_table(pa.table({"question": rows}), folder / f"{name}.parquet", row_group_size=2)
    out = answered(run_locally, str(folder), tmp_path)
    assert out.column("question").to_pylist() == questions[3:5] + questions[:3] + questions[5:]


def test_a_csv_file(run_locally, tmp_path: Path):
    questions = asked(5)
    pd.DataFrame({"question": questions, "score": [n / 2 for n in range(5)]}).to_csv(tmp_path / "q.csv", index=False)
    out = answered(run_locally, str(tmp_path / "q.csv"), tmp_path)
    assert out.column("question").to_pylist() == questions and out.column("score").to_pylist() == [0, 0.5, 1, 1.5, 2]


def test_a_jsonl_file_whose_row_lacks_the_field_fails_that_row_and_keeps_nested_fields(run_locally, tmp_path: Path):
    questions = asked(4)
    rows = [{"question": text, "meta": {"tags": ["a", "b"], "id": n}} for n, text in enumerate(questions)]
    del rows[2]["question"]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")

    summary: RunSummary = run_locally(
        run_table, input=str(tmp_path / "q.jsonl"), prompt="{question}", output_dir=str(tmp_path / "out"),
        max_failed_fraction=0.5, **SIMULATED,
    )  # fmt: skip

    out = pq.read_table(summary.output.uri).to_pylist()
    assert [row["meta"] for row in out] == [row["meta"] for row in rows]
    assert [row["error"] for row in out] == [None, None, "null_value: column 'question' is null", None]


def test_a_hugging_face_dataset_saved_to_disk_and_a_split_of_a_saved_dataset_dict(run_locally, tmp_path: Path):
    questions = asked(5)
    dataset = datasets.Dataset.from_dict({"question": questions, "n": list(range(5))})
    dataset.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": dataset.select(range(2)), "test": dataset}).save_to_disk(str(tmp_path / "dict"))

    assert answered(run_locally, str(tmp_path / "saved"), tmp_path).column("question").to_pylist() == questions
    split = answered(run_locally, f"{tmp_path / 'dict'}:test", tmp_path)
    assert split.column("n").to_pylist() == list(range(5))
    with pytest.raises(flyte.errors.RuntimeUserError, match="holds the splits train, test: name one, as"):
        run_locally(run_table, input=str(tmp_path / "dict"), prompt="{question}", **SIMULATED)


def test_a_hub_dataset_out_of_reach_is_a_clear_error_before_anything_runs(run_locally, tmp_path, monkeypatch):
    from flyteplugins_batcher.jobs._table import source

    monkeypatch.setattr(source, "hub_reachable", lambda: False)  # offline, whatever this machine's network
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(
        flyte.errors.RuntimeUserError,
        match=r"no file or folder here has that name, and the Hugging Face Hub, to load 'openai/gsm8k' from, is out",
    ):
        run_locally(run_table, input="openai/gsm8k:main:test", prompt="{question}", **SIMULATED)


def test_a_path_that_names_nothing_is_a_clear_error(run_locally, tmp_path: Path):
    with pytest.raises(flyte.errors.RuntimeUserError, match=r"no file or folder at .*missing\.parquet"):
        run_locally(run_table, input=str(tmp_path / "missing.parquet"), prompt="{question}", **SIMULATED)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(flyte.errors.RuntimeUserError, match=r"cannot read 'notes\.txt' as a table"):
        run_locally(run_table, input=str(tmp_path / "notes.txt"), prompt="{question}", **SIMULATED)


def test_a_folder_in_an_object_store(run_locally, tmp_path: Path):
    questions = asked(5)
    bucket = f"memory://bucket-{uuid.uuid4().hex[:8]}/questions"
    with fsspec.open(f"{bucket}/part-0.parquet", "wb") as file:
        pq.write_table(pa.table({"question": questions}), file)
    assert answered(run_locally, bucket, tmp_path).column("question").to_pylist() == questions


# -- a flyte.io.DataFrame, and tables in memory --------------------------------------------------------------------

env = flyte.TaskEnvironment("table_formats_test", depends_on=[table_driver_env])
in_memory = TableProcessor(column="question", settings=EngineSettings(**SIMULATED), run=RunOptions(chunk_size=2))


@env.task
async def from_a_dataframe(questions: list[str]) -> RunSummary:
    frame = DataFrame.wrap_df(pd.DataFrame({"question": questions, "n": range(len(questions))}))
    return await run_table(input=frame, column="question", chunk_size=2, **SIMULATED)


@env.task
async def from_memory(questions: list[str]) -> list[str]:
    frames = (pd.DataFrame({"question": questions}), pa.table({"question": questions}))
    outputs = [await in_memory(frame) for frame in frames]
    return [str(output.uri) for output in outputs]


def test_a_flyte_dataframe_from_another_task(run_locally):
    questions = asked(5)
    summary: RunSummary = run_locally(from_a_dataframe, questions=questions)
    out = pq.read_table(summary.output.uri)
    assert out.column("question").to_pylist() == questions and out.column("n").to_pylist() == list(range(5))
    assert out.column("error").null_count == 5


def test_a_pandas_dataframe_and_an_arrow_table_in_memory(run_locally):
    questions = asked(3)
    for uri in run_locally(from_memory, questions=questions):
        out = pq.read_table(uri)
        assert out.column("question").to_pylist() == questions and out.column("error").null_count == 3
