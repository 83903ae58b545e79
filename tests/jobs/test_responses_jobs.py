"""`/v1/responses` lines through the JSONL job (flyte's local runner, the bundled SmolLM2 on Transformers): good lines
are answered as Responses API `response` objects, and the issue's bad input fails each line alone, naming what is
wrong, in a run that finishes: an unsupported item type, a schema the grammar compiler refuses (caught only by the
engine, after the line was read), and a score line sent to the text generator. Online, the same bad input is a 400
naming the field (`tests/server/test_responses.py`, `tests/server/test_pooling_online.py`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flyte.io import File

from flyteplugins_batcher.jobs import run_batch_file

openai_types = pytest.importorskip("openai.types.responses", reason="needs the test extra")

pytestmark = pytest.mark.slow

NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
EMPTY_RANGE = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}}
"""A valid JSON schema that no value can follow: only the grammar compiler refuses it."""


def responses_line(custom_id: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": body}


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"format": {"type": "json_schema", "name": "answer", "schema": schema}}


LINES = [
    responses_line("plain", input="Say hello.", max_output_tokens=8, temperature=0),
    responses_line("json", input="Invent a user.", max_output_tokens=24, temperature=0, text=schema_format(NAME)),
    responses_line("empty-range", input="Pick a number.", max_output_tokens=8, text=schema_format(EMPTY_RANGE)),
    responses_line("image", input=[{"type": "input_image", "image_url": "https://example.com/cat.png"}]),
    {
        "custom_id": "score-on-generator",
        "method": "POST",
        "url": "/v1/score",
        "body": {"model": "SmolLM2-135M-Instruct", "queries": "what is a cat", "documents": ["a small feline"]},
    },
]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory, run_locally: Any) -> tuple[dict, dict]:
    folder = tmp_path_factory.mktemp("responses-job")
    source = folder / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    summary = run_locally(
        run_batch_file,
        input=File.from_local_sync(str(source)),
        output_dir=str(folder / "out"),
        max_failed_fraction=1.0,
    )

    def by_id(path: str) -> dict[str, dict[str, Any]]:
        return {line["custom_id"]: line for line in map(json.loads, Path(path).read_text().splitlines())}

    return by_id(summary.results.path), by_id(summary.errors.path)


def test_good_responses_lines_are_answered_as_responses(outcome: tuple[dict, dict]) -> None:
    results, _ = outcome
    assert sorted(results) == ["json", "plain"]
    for line in results.values():
        response = openai_types.Response.model_validate(line["response"]["body"])
        assert response.output_text and response.usage is not None and response.usage.output_tokens > 0
    assert set(json.loads(results["json"]["response"]["body"]["output"][0]["content"][0]["text"])) >= {"name"}


def test_bad_input_fails_each_line_alone_naming_what_is_wrong(outcome: tuple[dict, dict]) -> None:
    _, errors = outcome
    assert sorted(errors) == ["empty-range", "image", "score-on-generator"]
    assert all(line["response"] is None and line["error"]["message"] for line in errors.values())
    image = errors["image"]["error"]
    assert image["code"] == "invalid_body" and "body.input[0].type 'input_image' is not supported" in image["message"]
    # The engine's grammar compiler refuses it as the record runs: its line fails, naming the field as the line
    # wrote it (text.format, not response_format, the Chat field it is converted to) and why.
    empty_range = errors["empty-range"]["error"]
    assert empty_range["code"] == "invalid_request"
    assert "text.format json_schema 'answer' cannot be enforced: Invalid range" in empty_range["message"]
    assert "response_format" not in empty_range["message"]
    generator = errors["score-on-generator"]["error"]
    assert generator["code"] == "model_mismatch" and "is a text generator: it cannot score" in generator["message"]
