"""Files kept in an object store (`files_uri`) as well as in each replica's own folder.

`file:///...` is the object store here: fsspec's local filesystem, the same code path (flyte's
filesystems, used synchronously) as `s3://` and `gs://` but for the atomic write a folder allows.
The unit tests drive `FileStore` on SQLite; the last test runs two real servers, each with a data
folder of its own, on one PostgreSQL and one `--files-uri`.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from flyteplugins_batcher.server import ServerSettings
from flyteplugins_batcher.server._http.errors import APIError
from flyteplugins_batcher.server._state.errors import StateError
from flyteplugins_batcher.server._state.files import FileStore, ObjectFiles
from flyteplugins_batcher.server._state.store import Store
from tests.server.conftest import chat_line, jsonl, simulated, wait_for_batch

LINES = b'{"custom_id": "a"}\n{"custom_id": "b"}\n'


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "server.db")


@pytest.fixture
def files_uri(tmp_path: Path) -> str:
    return (tmp_path / "bucket" / "batcher" / "files").as_uri()


def replica(tmp_path: Path, store: Store, files_uri: str, name: str) -> FileStore:
    """A replica's `FileStore`: a folder of its own, the shared store and object store."""
    return FileStore(tmp_path / name / "files", store, max_bytes=2**20, files_uri=files_uri)


def in_bucket(tmp_path: Path) -> list[str]:
    return sorted(path.name for path in (tmp_path / "bucket" / "batcher" / "files").iterdir())


def test_an_upload_is_put_to_the_object_store_before_its_row_is_committed(
    tmp_path: Path, store: Store, files_uri: str
) -> None:
    files = replica(tmp_path, store, files_uri, "a")

    row = files.save_upload(io.BytesIO(LINES), filename="in.jsonl", purpose="batch")

    assert in_bucket(tmp_path) == [row["id"]]  # no temporary name left beside it
    assert (tmp_path / "bucket" / "batcher" / "files" / row["id"]).read_bytes() == LINES
    assert files.path(row["id"]).read_bytes() == LINES and store.file(row["id"]) is not None
    assert files.objects is not None and files.objects.exists(row["id"])


def test_another_replica_reads_a_file_from_the_object_store_into_its_own_folder(
    tmp_path: Path, store: Store, files_uri: str
) -> None:
    made = replica(tmp_path, store, files_uri, "a")
    other = replica(tmp_path, store, files_uri, "b")
    upload = made.save_upload(io.BytesIO(LINES), filename="in.jsonl", purpose="batch")
    output = made.write_output(['{"custom_id": "a"}'], filename="out.jsonl")
    store.insert_file(output)

    assert not other.path(upload["id"]).exists()
    assert other.content(upload["id"]).read_bytes() == LINES
    assert other.content(output["id"]).read_bytes() == b'{"custom_id": "a"}\n'
    assert sorted(path.name for path in other.folder.iterdir()) == sorted([upload["id"], output["id"]])
    assert other.local_path("file-unknown") is None


def test_a_delete_removes_the_file_from_the_folder_and_the_object_store(
    tmp_path: Path, store: Store, files_uri: str
) -> None:
    made = replica(tmp_path, store, files_uri, "a")
    other = replica(tmp_path, store, files_uri, "b")
    row = made.save_upload(io.BytesIO(LINES), filename="in.jsonl", purpose="batch")
    other.content(row["id"])  # a copy in the other replica's folder too

    other.delete(row["id"])

    assert in_bucket(tmp_path) == [] and not other.path(row["id"]).exists() and store.file(row["id"]) is None
    with pytest.raises(StateError) as gone:
        made.content(row["id"])  # its row is gone: the copy left in the first folder is never served
    assert APIError.from_state(gone.value).status == 404
    assert made.remove_leftovers() == 1 and list(made.folder.iterdir()) == []  # removed at the next start


def test_a_file_gone_from_the_folder_and_the_object_store_is_a_404_that_names_only_its_id(
    tmp_path: Path, store: Store, files_uri: str
) -> None:
    files = replica(tmp_path, store, files_uri, "a")
    row = files.save_upload(io.BytesIO(LINES), filename="in.jsonl", purpose="batch")
    files.path(row["id"]).unlink()
    assert files.objects is not None
    files.objects.delete(row["id"])

    with pytest.raises(StateError) as missing:
        files.content(row["id"], param="input_file_id")

    assert APIError.from_state(missing.value).status == 404 and missing.value.param == "input_file_id"
    assert row["id"] in missing.value.message
    assert "bucket" not in missing.value.message and "file://" not in missing.value.message
    assert list(files.folder.iterdir()) == []  # no temporary file left by the failed fetch


def test_a_crash_between_the_local_write_and_the_put_leaves_no_row_and_no_file(
    tmp_path: Path, store: Store, files_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = replica(tmp_path, store, files_uri, "a")

    def unreachable(self: ObjectFiles, path: Path, file_id: str) -> None:
        raise OSError("the object store is out of reach")

    monkeypatch.setattr(ObjectFiles, "put", unreachable)

    with pytest.raises(OSError, match="out of reach"):
        files.save_upload(io.BytesIO(LINES), filename="in.jsonl", purpose="batch")
    with pytest.raises(OSError, match="out of reach"):
        files.write_output(['{"custom_id": "a"}'], filename="out.jsonl")

    assert store.file_ids() == set() and list(files.folder.iterdir()) == [] and in_bucket(tmp_path) == []


def test_a_fetch_interrupted_midway_leaves_no_partial_file(
    tmp_path: Path, store: Store, files_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = replica(tmp_path, store, files_uri, "a")
    other = replica(tmp_path, store, files_uri, "b")
    row = made.save_upload(io.BytesIO(LINES * 1000), filename="in.jsonl", purpose="batch")

    class Broken(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            if self.tell():
                raise OSError("connection reset")
            return super().read(10)

    monkeypatch.setattr(ObjectFiles, "open", lambda self, file_id: Broken(LINES))

    with pytest.raises(OSError, match="connection reset"):
        other.content(row["id"])
    assert list(other.folder.iterdir()) == []


def test_files_uri_is_a_setting_and_must_be_a_uri(tmp_path: Path, store: Store) -> None:
    settings = ServerSettings.from_environment({"BATCH_SERVE_FILES_URI": "s3://bucket/batcher/files"})
    assert settings.files_uri == "s3://bucket/batcher/files"
    assert ServerSettings.from_environment(settings.environment()) == settings
    with pytest.raises(ValueError, match="object-store prefix"):
        FileStore(tmp_path / "files", store, max_bytes=2**20, files_uri=str(tmp_path / "bucket"))
    plain = FileStore(tmp_path / "files", store, max_bytes=2**20)
    assert plain.objects is None and plain.local_path("file-x") is None


# -- two real servers, each with its own data folder ---------------------------------------------------------


@pytest.mark.slow
def test_two_servers_with_folders_of_their_own_share_files_through_the_object_store(
    start: Any, tmp_path: Path, postgres_url: str
) -> None:
    shared = ["--database-url", postgres_url, "--lease-s", "2", "--files-uri", (tmp_path / "objects").as_uri()]
    first = start(*simulated(), *shared, data_dir=tmp_path / "a")
    second = start(*simulated(), *shared, data_dir=tmp_path / "b")
    lines = [chat_line(f"r{n}", f"question {n}") for n in range(30)]

    input_id = first.client().files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch").id
    created = second.client().batches.create(
        input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_for_batch(first.client(), created.id)

    assert batch.status == "completed" and batch.request_counts.completed == 30
    assert batch.output_file_id is not None and batch.error_file_id is not None
    outputs = [server.client().files.content(batch.output_file_id).text for server in (second, first)]
    assert outputs[0] == outputs[1]
    answered = [json.loads(line)["custom_id"] for line in outputs[0].splitlines()]
    assert Counter(answered) == Counter(f"r{n}" for n in range(30))
    assert first.client().files.content(batch.error_file_id).text == ""
    assert sorted(path.name for path in (tmp_path / "objects").iterdir()) == sorted(
        [input_id, batch.output_file_id, batch.error_file_id]
    )
    for folder in ("a", "b"):  # each folder holds its own copies: the bytes went through the object store
        assert (tmp_path / folder / "files" / batch.output_file_id).is_file()
