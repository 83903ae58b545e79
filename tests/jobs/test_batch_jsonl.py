"""The JSONL batch job end to end through flyte's local runner, with the real SmolLM2."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import flyte.errors
import pytest
from flyte.io import File

from flyteplugins_batcher.jobs import RunSummary, run_batch_file
from tests.jobs.conftest import CountingBatcher

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


def chat(custom_id: str, text: str, **body: object) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def write(tmp_path: Path, lines: list[object]) -> File:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return File.from_local_sync(str(path))


def read_lines(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


GOOD = [
    chat("chat-1", "What is 2 + 2?"),
    chat("short", "Tell me about the ocean.", max_tokens=3),
    {"custom_id": "completion-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon a time"}},
    {"custom_id": "plain-1", "prompt": "Name a color."},
    {"messages": [{"role": "user", "content": "Say hi."}]},
]
BAD = [
    ("{this is not json", "invalid_json"),
    ({"method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}, "missing_custom_id"),
    (chat("chat-1", "A second request with the first one's id"), "duplicate_custom_id"),
    ({"custom_id": "moderate", "method": "POST", "url": "/v1/moderations", "body": {"input": "x"}}, "invalid_url"),
    ({"custom_id": "empty-body", "method": "POST", "url": "/v1/chat/completions", "body": {}}, "invalid_body"),
    (chat("other-model", "hi", model="gpt-4o"), "model_mismatch"),
    (chat("too-hot", "hi", temperature=-2), "invalid_request"),
    (chat("too-long", "word " * 9000), "context_length_exceeded"),
]


def test_good_lines_are_answered_and_each_bad_line_fails_alone_with_its_code(run_locally, tmp_path: Path):
    lines = [GOOD[0], BAD[0][0], GOOD[1], BAD[1][0], GOOD[2], BAD[2][0], BAD[3][0], GOOD[3], BAD[4][0], ""]
    lines += [BAD[5][0], GOOD[4], BAD[6][0], BAD[7][0]]
    request_file = write(tmp_path, lines)
    outputs = tmp_path / "out"

    summary: RunSummary = run_locally(
        run_batch_file,
        input=request_file,
        output_dir=str(outputs),
        max_new_tokens=12,
        chunk_size=2,
        max_failed_fraction=1.0,
    )

    assert (summary.requests, summary.answered, summary.failed) == (13, 5, 8)  # the blank line is no request
    results = {line["custom_id"]: line for line in read_lines(summary.results.path)}
    assert set(results) == {"chat-1", "short", "completion-1", "plain-1", "line-12"}
    body = results["chat-1"]["response"]["body"]
    assert results["chat-1"]["response"]["status_code"] == 200 and body["model"] == MODEL
    assert body["choices"][0]["message"]["content"] and body["choices"][0]["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    short = results["short"]["response"]["body"]
    assert short["usage"]["completion_tokens"] == 3 and short["choices"][0]["finish_reason"] == "length"
    assert results["completion-1"]["response"]["body"]["choices"][0]["text"]

    errors = read_lines(summary.errors.path)
    assert sorted(error["error"]["code"] for error in errors) == sorted(code for _, code in BAD)
    duplicate = next(error for error in errors if error["error"]["code"] == "duplicate_custom_id")
    assert duplicate["custom_id"] == "chat-1" and "already used on line 1" in duplicate["error"]["message"]
    assert all(error["response"] is None and error["error"]["message"] for error in errors)
    assert sorted((outputs).iterdir()) == [outputs / "errors.jsonl", outputs / "results.jsonl"]


def test_failures_beyond_an_opted_in_threshold_exit_non_zero_after_writing_everything(run_locally, tmp_path: Path):
    request_file = write(tmp_path, [GOOD[3], "{broken"])
    outputs = tmp_path / "out"

    with pytest.raises(flyte.errors.RuntimeUserError, match=r"1 of 2 requests failed \(50.0%, allowed: 0.0%\)"):
        run_locally(
            run_batch_file, input=request_file, output_dir=str(outputs), max_new_tokens=4, max_failed_fraction=0.0
        )

    assert len(read_lines(str(outputs / "results.jsonl"))) == 1
    assert read_lines(str(outputs / "errors.jsonl"))[0]["error"]["code"] == "invalid_json"


def test_an_empty_file_is_an_empty_result_as_vllm_run_batch_answers_it(run_locally, tmp_path: Path):
    summary: RunSummary = run_locally(run_batch_file, input=write(tmp_path, ["", "   "]), max_failed_fraction=0.0)
    assert (summary.requests, summary.answered, summary.failed) == (0, 0, 0)
    assert read_lines(summary.results.path) == [] and read_lines(summary.errors.path) == []


def test_a_model_mismatch_can_be_ignored(run_locally, tmp_path: Path):
    summary: RunSummary = run_locally(
        run_batch_file,
        input=write(tmp_path, [chat("other-model", "hi", model="gpt-4o")]),
        model_mismatch="ignore",
        max_new_tokens=4,
    )
    [line] = read_lines(summary.results.path)
    assert line["response"]["body"]["model"] == MODEL  # answered by the served model, which it names


def test_a_rerun_after_a_crash_recomputes_only_the_unfinished_chunks(cached_run, tmp_path: Path):
    marker = uuid.uuid4().hex[:8]  # requests no earlier run has cached
    request_file = write(tmp_path, [{"custom_id": f"r{n}", "prompt": f"Count to {n} ({marker})"} for n in range(12)])
    job = {"input": request_file, "chunk_size": 3, "max_new_tokens": 4, "max_failed_fraction": 0.0}  # fail loudly
    cached_run(run_batch_file, CountingBatcher(fail_when=lambda text: "Count to 10 " in text), fails="failed", **job)

    healthy = CountingBatcher()
    summary: RunSummary = cached_run(run_batch_file, healthy, **job)

    assert (summary.answered, summary.failed, summary.reused, summary.retried) == (12, 0, 9, 0)
    # The one chunk that crashed, whichever lines placement put beside line 10 (their prompts share "Count to 1").
    assert len(healthy.prompts) == 3 and f"Count to 10 ({marker})" in healthy.prompts
    assert sorted(line["custom_id"] for line in read_lines(summary.results.path)) == sorted(f"r{n}" for n in range(12))


def test_a_rerun_reuses_the_answered_lines_and_sends_the_failed_ones_again(cached_run, tmp_path: Path):
    marker = uuid.uuid4().hex[:8]
    request_file = write(tmp_path, [{"custom_id": f"r{n}", "prompt": f"Count to {n} ({marker})"} for n in range(6)])
    job = {"input": request_file, "chunk_size": 3, "max_new_tokens": 4, "max_failed_fraction": 0.0}  # fail loudly
    refusing = CountingBatcher(refuse_when=lambda text: "Count to 4 " in text)  # say, xgrammar was missing
    cached_run(run_batch_file, refusing, fails="1 of 6 requests failed", **job)

    fixed = CountingBatcher()
    summary: RunSummary = cached_run(run_batch_file, fixed, **job)

    assert fixed.prompts == [f"Count to 4 ({marker})"]  # the failed line only, not its chunk or the other chunk
    assert (summary.answered, summary.failed, summary.reused, summary.retried) == (6, 0, 5, 1)
    assert sorted(line["custom_id"] for line in read_lines(summary.results.path)) == [f"r{n}" for n in range(6)]
    assert read_lines(summary.errors.path) == []

    again = CountingBatcher()
    third: RunSummary = cached_run(run_batch_file, again, **job)
    assert again.prompts == [] and (third.answered, third.reused, third.retried) == (6, 6, 0)  # the retry is cached
