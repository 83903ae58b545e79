"""Issue 17 through the JSONL workflow and flyte's local runner: structured output, n samples, embeddings lines
(mixed with chat lines, each kind on its own replicas), input hygiene, the output folder and the progress output."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import flyte.errors
import jsonschema
import numpy as np
import pytest
from flyte.io import File

from flyteplugins_batcher.engines import EmbeddingModel
from flyteplugins_batcher.jobs import RunSummary, run_batch_file
from flyteplugins_batcher.replica import EmbeddingReplica
from tests.jobs.test_batch_jsonl import chat, read_lines, write

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
EMBEDDING_MODEL = "all-MiniLM-L6-v2"
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}
BROKEN = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}


def json_schema(schema: dict, name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def embedding(custom_id: str, text: str | list[str], **body: object) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": {"input": text, **body}}


def by_id(path: str) -> dict[str, dict]:
    return {line["custom_id"]: line for line in read_lines(path)}


def float32(encoded: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(encoded), dtype="<f4")


def test_structured_output_and_n_samples_end_to_end_with_an_invalid_schema_failing_alone(run_locally, tmp_path: Path):
    lines = [
        chat("schema", "Invent a person: a name and an age, in JSON.", response_format=json_schema(PERSON, "p")),
        chat("object", "Describe a cat as a JSON object.", response_format={"type": "json_object"}),
        chat("plain", "Say hi.", max_tokens=6),
        chat("three", "Name a color.", n=3, temperature=1.0, seed=7, max_tokens=6),
        chat("broken", "Anything.", response_format=json_schema(BROKEN, "x")),
    ]
    summary: RunSummary = run_locally(
        run_batch_file,
        input=write(tmp_path, lines),
        engine="transformers",
        max_new_tokens=256,
        max_failed_fraction=1.0,
    )

    assert (summary.requests, summary.answered, summary.failed) == (5, 4, 1)
    results = by_id(summary.results.path)
    for custom_id in ("schema", "object"):
        [choice] = results[custom_id]["response"]["body"]["choices"]
        assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
        answer = json.loads(choice["message"]["content"])
        jsonschema.validate(answer, PERSON if custom_id == "schema" else {"type": "object"})
    three = results["three"]["response"]["body"]
    assert [choice["index"] for choice in three["choices"]] == [0, 1, 2]
    assert all(choice["message"]["content"] for choice in three["choices"])
    cut = [choice["finish_reason"] == "length" for choice in three["choices"]]
    assert 3 <= three["usage"]["completion_tokens"] <= 3 * 6  # every sample counted
    assert all(cut) <= (three["usage"]["completion_tokens"] == 3 * 6)
    assert len(results["plain"]["response"]["body"]["choices"]) == 1
    [error] = read_lines(summary.errors.path)
    assert (error["custom_id"], error["error"]["code"], error["error"]["line"]) == ("broken", "invalid_request", 5)
    assert "json_schema 'x' cannot be enforced" in error["error"]["message"]


def test_a_mixed_file_answers_chat_completion_and_embedding_lines_in_openais_shapes(run_locally, tmp_path: Path):
    texts = ["The quick brown fox.", "A second, longer text about rivers and the bridges over them."]
    lines = [
        embedding("e-float", texts[0], model=EMBEDDING_MODEL),
        chat("c-1", "Say hi.", max_tokens=4),
        embedding("e-base64", texts, encoding_format="base64"),
        {"custom_id": "p-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once", "max_tokens": 4}},
        embedding("e-other-model", "x", model="text-embedding-3-small"),
    ]
    out = tmp_path / "out"
    summary: RunSummary = run_locally(
        run_batch_file,
        input=write(tmp_path, lines),
        output_dir=f"file://{out}",
        chunk_size=1,
        embedding_chunk_size=1,
        max_failed_fraction=1.0,
    )

    assert Path(summary.results.path) == (out / "results.jsonl").resolve()
    results = by_id(summary.results.path)
    assert set(results) == {"e-float", "c-1", "e-base64", "p-1"}
    assert results["c-1"]["response"]["body"]["object"] == "chat.completion"
    assert results["p-1"]["response"]["body"]["object"] == "text_completion"
    expected = [np.asarray(item.vector) for item in EmbeddingModel().encode(texts)]
    one = results["e-float"]["response"]["body"]
    assert one["object"] == "list" and one["model"] == EMBEDDING_MODEL and one["usage"]["prompt_tokens"] > 0
    assert one["usage"]["total_tokens"] == one["usage"]["prompt_tokens"]
    [item] = one["data"]
    assert item["object"] == "embedding" and item["index"] == 0
    assert np.abs(np.asarray(item["embedding"]) - expected[0]).max() <= 1e-5
    two = results["e-base64"]["response"]["body"]
    assert [item["index"] for item in two["data"]] == [0, 1]
    for item, vector in zip(two["data"], expected, strict=True):
        assert np.abs(float32(item["embedding"]) - vector).max() <= 1e-5
    assert two["usage"]["prompt_tokens"] > one["usage"]["prompt_tokens"]
    [mismatch] = read_lines(summary.errors.path)
    assert (mismatch["custom_id"], mismatch["error"]["code"]) == ("e-other-model", "model_mismatch")


def test_a_run_without_embedding_lines_never_loads_the_embedding_model(run_locally, fresh_replica, tmp_path: Path):
    embedding = EmbeddingReplica()
    embedding.install()  # this process's embedding replica, as a freshly started one
    try:
        summary = run_locally(run_batch_file, input=write(tmp_path, [chat("c", "Hi", max_tokens=2)]))

        assert summary.answered == 1 and fresh_replica.shared.loaded_model is not None
        assert not embedding.model.loaded and embedding.embed.batcher is None
    finally:
        asyncio.run(embedding.aclose())  # it never started


def test_a_run_without_chat_lines_never_loads_an_llm(run_locally, fresh_replica, tmp_path: Path):
    embedded_before = EmbeddingReplica.of_process().model.stats.records

    summary = run_locally(run_batch_file, input=write(tmp_path, [embedding("e", ["one", "two"])]))

    assert summary.answered == 1 and EmbeddingReplica.of_process().model.stats.records == embedded_before + 2
    assert fresh_replica.shared.loaded_model is None and fresh_replica.shared.batcher is None


def test_a_bom_is_accepted_and_bad_bytes_and_out_of_range_settings_fail_their_line_alone(run_locally, tmp_path: Path):
    path = tmp_path / "requests.jsonl"
    lines = [
        b"\xef\xbb\xbf" + json.dumps({"custom_id": "bom", "prompt": "Hi"}).encode(),
        b'{"custom_id": "bytes", "prompt": "caf\xe9"}',
        json.dumps(chat("hot", "Hi", temperature=5.0)).encode(),
        json.dumps(chat("long", "Hi", max_tokens=0)).encode(),
        json.dumps({"custom_id": 7, "prompt": "Hi"}).encode(),
        json.dumps({"custom_id": "fine", "prompt": "Hi"}).encode(),
    ]
    path.write_bytes(b"\r\n".join(lines) + b"\r\n")  # as a Windows editor writes it

    summary = run_locally(
        run_batch_file, input=File.from_local_sync(str(path)), max_new_tokens=2, max_failed_fraction=1.0
    )

    assert set(by_id(summary.results.path)) == {"bom", "fine"}
    errors = {line["error"]["line"]: line["error"] for line in read_lines(summary.errors.path)}
    assert errors[2]["code"] == "invalid_json" and "not valid UTF-8" in errors[2]["message"]
    assert "byte offset 37" in errors[2]["message"]
    assert errors[3]["code"] == "invalid_request" and "body.temperature must be from 0 to 2" in errors[3]["message"]
    assert errors[4]["code"] == "invalid_request" and "body.max_tokens" in errors[4]["message"]
    assert errors[5]["code"] == "invalid_custom_id"
    assert sorted(errors) == [2, 3, 4, 5]


def test_publishing_that_fails_at_the_end_prints_the_summary_and_where_the_files_are(
    run_locally, replicas, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from flyteplugins_batcher.replica import LLMReplica
    from tests.jobs.conftest import CountingBatcher

    out = tmp_path / "out"

    def swap_folder_for_a_file(text: str) -> bool:
        if out.is_dir():  # after the check, before publishing: the destination breaks while the job runs
            out.rmdir()
            out.write_text("in the way")
        return False

    replicas.use(LLMReplica(CountingBatcher(fail_when=swap_folder_for_a_file).make))
    with pytest.raises(flyte.errors.RuntimeUserError, match=r"could not publish to .*the files are in (\S+)") as caught:
        run_locally(run_batch_file, input=write(tmp_path, [chat("c", "Hi")]), output_dir=str(out), max_new_tokens=2)

    work = Path(str(caught.value).split("the files are in ")[1].split()[0].rstrip(".;,'\""))
    try:
        assert work.name.startswith("batch-jsonl-") and len(read_lines(str(work / "results.jsonl"))) == 1
        summary = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("answered "))
        assert f"results: {work / 'results.jsonl'}" in summary
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_local_run_prints_its_progress_the_summary_and_where_the_report_is(tmp_path: Path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(chat(f"c{n}", f"Count to {n}.", max_tokens=2)) + "\n" for n in range(3)))
    temp = tmp_path / "temp"
    temp.mkdir()
    environment = {**os.environ, "BATCH_PROGRESS_INTERVAL_S": "0", "TMPDIR": str(temp)}
    command = [str(Path(sys.executable).parent / "flyte"), "run", "--local", "workflows/batch_jsonl.py", "main"]
    command += ["--input", str(requests), "--chunk_size", "1", "--max_chunks_in_flight", "1", "--no-resume"]
    command += ["--order", "file"]  # a chunk goes as soon as its line is read: progress shows the file still being read

    run = subprocess.run(command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=600)

    assert run.returncode == 0, run.stderr[-3000:]
    ours = list(itertools.takewhile(lambda line: "╭" not in line, run.stdout.splitlines()))  # then flyte's panel
    progress, (summary, report) = ours[:-2], ours[-2:]
    counts = [re.match(r"progress: (\d+)(/| requests done of )(\d+)", line) for line in progress]
    seen = [(int(count[1]), int(count[3])) for count in counts if count]
    assert seen[0] == (1, 2) and seen[-1] == (3, 3) and seen == sorted(seen)  # the first while the file is read
    assert {done for done, _ in seen} == {1, 2, 3}
    assert all(before != after for before, after in itertools.pairwise(progress))  # a line per change
    assert progress[-1].startswith("progress: 3/3 requests (100%), 0 failed | ") and progress[-1].endswith("| done")
    assert re.search(r"\| \d+\.\d\d requests/s, \d+(\.\d)? output tokens/s \|", progress[-1])
    assert summary.startswith("answered 3/3 requests, 0 failed |")
    results = Path(summary.split("results: ")[1].split(" |")[0])
    assert results.parts[:4] == ("/", "tmp", "flyte", "raw_data") and len(read_lines(str(results))) == 3
    assert report.startswith("report: /tmp/flyte/metadata/") and Path(report.removeprefix("report: ")).is_file()
    assert not list(temp.glob("batch-jsonl-*"))  # no work folder is left behind
    assert not list(temp.rglob("results.jsonl"))  # (flyte leaves an empty folder of its own there)
