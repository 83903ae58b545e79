"""`--output_dir` is checked before any inference; a run's files are published once and its work folder removed."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path, PurePosixPath

import flyte
import flyte.errors
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flyte.io import File

from flyteplugins_batcher.jobs import run_batch_file, solve_gsm8k
from flyteplugins_batcher.jobs._outputs import Destination, InputOrderFile, OutputDirError, PublishError, WorkFolder
from flyteplugins_batcher.jobs._table.publish import check_output, publish_parts

NAMES = ("results.jsonl", "errors.jsonl")


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder that exists and cannot be written to, by this user (root writes through permissions)."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o500)
        return folder
    if not Path("/sys").is_dir():
        pytest.skip("needs /sys, which even root cannot write files in")
    return Path("/sys")


def test_a_local_folder_is_created_and_a_file_uri_is_a_local_folder(tmp_path: Path):
    assert Destination.check(str(tmp_path / "a" / "b"), NAMES).folder == (tmp_path / "a" / "b").resolve()
    assert not list((tmp_path / "a" / "b").iterdir())  # created, and the write check left nothing behind
    assert Destination.check(f"file://{tmp_path}/c").folder == (tmp_path / "c").resolve()
    assert Destination.check(f"file://localhost{tmp_path}/d").folder == (tmp_path / "d").resolve()


def test_remote_uris_go_to_flyte_and_nothing_means_the_runs_own_storage():
    assert Destination.check("s3://bucket/out/") == Destination(uri="s3://bucket/out")
    assert Destination.check("gs://bucket") == Destination(uri="gs://bucket")
    assert Destination.check("") == Destination()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("{file}", "is a file, not a folder"),
        ("{file}/below", "cannot write to"),
        ("{unwritable}", "cannot write to .*Permission denied"),
        ("ftp://host/out", r"cannot write to ftp://.*s3://"),
        ("s3://", "cannot write to s3://"),
        ("file://", "names no folder"),
        ("{clash}", "results.jsonl is a folder"),
    ],
)
def test_a_destination_that_cannot_work_fails_at_once_with_a_clear_message(tmp_path: Path, given: str, message: str):
    existing = tmp_path / "existing.txt"
    existing.write_text("not a folder")
    (tmp_path / "clash" / "results.jsonl").mkdir(parents=True)
    output_dir = given.format(file=existing, unwritable=unwritable_folder(tmp_path), clash=tmp_path / "clash")

    with pytest.raises(OutputDirError, match=message):
        Destination.check(output_dir, NAMES)


def test_one_output_file_names_its_folder_and_its_name_checked_as_a_folder_is(tmp_path: Path):
    destination, name = Destination.for_file(str(tmp_path / "new" / "out.jsonl"))
    assert (destination.folder, name) == ((tmp_path / "new").resolve(), "out.jsonl")
    assert Destination.for_file("s3://bucket/runs/out.jsonl") == (Destination(uri="s3://bucket/runs"), "out.jsonl")
    assert Destination.for_file(f"file://{tmp_path}/x.json")[0].folder == tmp_path.resolve()
    for bad in ("s3://bucket/runs/", "s3://out.jsonl", str(tmp_path) + "/"):
        with pytest.raises(OutputDirError):
            Destination.for_file(bad)
    (tmp_path / "taken.jsonl").mkdir()
    with pytest.raises(OutputDirError, match=r"taken\.jsonl is a folder"):
        Destination.for_file(str(tmp_path / "taken.jsonl"))


def test_an_input_order_file_writes_lines_in_input_order_whatever_order_they_finish_in(tmp_path: Path):
    output = InputOrderFile(tmp_path / "out.jsonl")
    for line in (7, 2, 9, 1, 3):
        output.add(line, {"custom_id": f"q{line}"})
    assert not output.path.exists()  # written once the run ends
    output.close()
    output.close()  # closing again changes nothing
    assert [json.loads(line)["custom_id"] for line in output.path.read_text().splitlines()] == [
        "q1",
        "q2",
        "q3",
        "q7",
        "q9",
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.jsonl"]  # its table is gone


def test_publishing_copies_to_the_folder_and_removes_the_work_folder(tmp_path: Path):
    flyte.init()
    work = WorkFolder("test-outputs-", Destination.check(str(tmp_path / "out"), NAMES))
    for name in NAMES:
        (work.path / name).write_text(f"{name}\n")

    published = asyncio.run(work.publish([work.path / name for name in NAMES]))

    assert [Path(file.path) for file in published] == [(tmp_path / "out" / name).resolve() for name in NAMES]
    assert (tmp_path / "out" / "errors.jsonl").read_text() == "errors.jsonl\n"
    assert not work.path.exists()


def test_a_failed_publish_keeps_the_work_folder_and_names_it(tmp_path: Path):
    work = WorkFolder("test-outputs-", Destination.check(str(tmp_path / "out"), NAMES))
    (work.path / "results.jsonl").write_text("kept\n")
    (tmp_path / "out").rmdir()
    (tmp_path / "out").write_text("the folder became a file after the check")

    with pytest.raises(PublishError, match=f"the files are in {work.path}"):
        asyncio.run(work.publish([work.path / "results.jsonl"]))

    assert (work.path / "results.jsonl").read_text() == "kept\n"
    work.discard()


def test_a_tables_parts_go_to_an_object_store_replacing_an_earlier_runs(tmp_path: Path):
    uri = f"memory://bucket-{uuid.uuid4().hex[:8]}/out"
    memory = fsspec.filesystem("memory")
    memory.pipe(f"{uri}/part-000000009.parquet", b"an earlier run's part")
    work = WorkFolder("table-test-", Destination(uri=uri))  # memory:// is no scheme check_output lets through
    parts = [work.path / f"part-{n:09d}.parquet" for n in range(2)]
    for n, part in enumerate(parts):
        pq.write_table(pa.table({"n": [n]}), part)

    assert asyncio.run(publish_parts(parts, work)) == uri
    assert sorted(PurePosixPath(path).name for path in memory.ls(uri, detail=False)) == [
        "part-000000000.parquet",
        "part-000000001.parquet",
    ]
    assert not work.path.exists()  # published: the work folder is gone


def test_a_tables_output_folder_may_hold_parts_and_hidden_files_but_nothing_else(tmp_path: Path):
    for name in ("part-000000000.parquet", ".hidden", "_half_copied"):
        (tmp_path / name).write_bytes(b"")
    assert check_output(str(tmp_path)).folder == tmp_path.resolve()
    (tmp_path / "notes.txt").write_text("not a part")
    with pytest.raises(OutputDirError, match=r"holds files that are not this job's parts \(notes.txt\)"):
        check_output(str(tmp_path))


@pytest.mark.parametrize("workflow", [run_batch_file, solve_gsm8k], ids=["batch_jsonl", "batch_llm"])
def test_a_bad_output_dir_fails_the_run_before_any_model_loads(run_locally, fresh_replica, tmp_path: Path, workflow):
    existing = tmp_path / "results-here.txt"
    existing.write_text("a file, not a folder")
    inputs = {"input": File.from_local_sync(str(write_requests(tmp_path)))} if workflow is run_batch_file else {}

    with pytest.raises(flyte.errors.RuntimeUserError, match="is a file, not a folder"):
        run_locally(workflow, output_dir=str(existing), **inputs)

    assert fresh_replica.shared.loaded_model is None  # nothing ran
    assert existing.read_text() == "a file, not a folder"


def write_requests(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "prompt": "Hi"}) + "\n")
    return path
