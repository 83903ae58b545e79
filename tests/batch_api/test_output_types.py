"""Every output line validates as vLLM's `BatchRequestOutput` and as OpenAI's batch output line, with their real types.

vLLM's type is `vllm.entrypoints.launchers.run_batch.BatchRequestOutput` (what `vllm run-batch` writes).
The `openai` package ships no type for a whole output line, so OpenAI's line is assembled from the
types it does ship: the response bodies (`ChatCompletion`, `Completion`, `CreateEmbeddingResponse`)
and `BatchError`, around the envelope OpenAI documents (`id`, `custom_id`, `response` with
`status_code`, `request_id` and `body`, `error`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import pytest

from flyteplugins_batcher.batch_api import EmbeddingRequest, RequestLineError, SeenIds, embedding_response_line
from flyteplugins_batcher.batch_api import response_line as answer_line
from flyteplugins_batcher.engines import Completion, GenerationConfig, Sample, TokenLogprob
from flyteplugins_batcher.replica import FinishedLine, LineRules

openai = pytest.importorskip("openai")
run_batch = pytest.importorskip("vllm.entrypoints.launchers.run_batch")

VLLM_LINE = Path(__file__).resolve().parents[1] / "data" / "vllm_run_batch_output.jsonl"
"""Lines a real `vllm run-batch` wrote (vLLM 0.32, the bundled SmolLM2): an answer, an unknown model, a bad url."""

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def line(custom_id: str | None, url: str, **body: Any) -> bytes:
    request = {"method": "POST", "url": url, "body": body}
    return json.dumps(request if custom_id is None else {"custom_id": custom_id, **request}).encode()


def chat(custom_id: str | None, **body: Any) -> bytes:
    return line(custom_id, "/v1/chat/completions", messages=[{"role": "user", "content": "2 + 2?"}], **body)


FILE = [
    chat("chat"),
    chat("two", n=2, temperature=1.0, logprobs=True, top_logprobs=2),
    chat("tools", tools=TOOLS, tool_choice="required"),
    chat("thinks"),
    line("text", "/v1/completions", prompt="Once upon", logprobs=1),
    line("vectors", "/v1/embeddings", input=["a", "b"]),
    b"{not json",
    chat(None),
    chat(7),
    chat("chat"),
    line("url", "/v1/moderations", input="x"),
    chat("model", model="gpt-4o"),
    chat("hot", temperature=9),
]
"""A file of answered lines of every kind, and a line for each way a line fails."""


def answers(rules: LineRules) -> list[dict[str, Any]]:
    """Each line of `FILE` answered (a made-up completion for each request) or failed, as the job writes them."""
    written = []
    with SeenIds() as seen:
        for number, request in rules.read(FILE, seen):
            if isinstance(request, RequestLineError):
                written.append(FinishedLine.failed(request).output)
            elif isinstance(request, EmbeddingRequest):
                vectors = [[0.5, -0.5]] * len(request.inputs)
                written.append(
                    embedding_response_line(request, vectors, prompt_tokens=4, model="m", request_number=number)
                )
            else:
                written.append(
                    answer_line(request, completion_for(request.custom_id), model="m", request_number=number)
                )
    return written


def completion_for(custom_id: str) -> Completion:
    logprob = TokenLogprob(" 4", -0.1, ((" 4", -0.1), (" four", -2.5)))
    if custom_id == "two":
        return Completion.from_samples(9, [Sample("4", 1, "stop", (logprob,)), Sample("four", 1, "stop", (logprob,))])
    if custom_id == "tools":
        return Completion.from_samples(9, [Sample('[{"name":"add","parameters":{"a":2}},{"na', 12, "length")])
    if custom_id == "thinks":
        return Completion.from_samples(9, [Sample("4", 6, "stop", None, "###", "two and two", 3)], cached_tokens=8)
    if custom_id == "text":
        return Completion.from_samples(3, [Sample(" a time", 2, "length", (logprob,))])
    return Completion("4", 9, 1, "stop")


def test_every_line_validates_as_vllms_batch_output_and_openais_batch_line() -> None:
    written = answers(LineRules("m", "m", "error", GenerationConfig(max_new_tokens=16)))
    assert len(written) == len(FILE)  # a line for every line of the file
    for output in written:
        assert isinstance(output["custom_id"], str), output  # both types require a string id
        vllm_line(output)
        OpenAIBatchLine.model_validate(output)
    by_id = {output["custom_id"]: output for output in written}
    assert {"line-7", "line-8", "line-9"} <= set(by_id)  # not JSON, no custom_id, a number for one
    assert [by_id[key]["error"]["code"] for key in ("line-7", "line-8", "line-9")] == [
        "invalid_json",
        "missing_custom_id",
        "invalid_custom_id",
    ]


def test_a_chat_answer_carries_every_field_a_real_vllm_run_batch_answer_does() -> None:
    vllm_answer = json.loads(VLLM_LINE.read_text().splitlines()[0])
    ours = answers(LineRules("m", "m", "error", GenerationConfig()))[0]
    assert fields(ours) >= fields(vllm_answer), sorted(fields(vllm_answer) - fields(ours))
    assert fields(ours) - fields(vllm_answer) == {
        "response.body.choices.message.reasoning_content",  # the reasoning's older name (DeepSeek's API, vLLM < 0.11)
        "response.body.usage.prompt_tokens_details.cached_tokens",  # vLLM's with --enable-prompt-tokens-details
        "response.body.usage.completion_tokens_details.reasoning_tokens",  # vLLM's with a reasoning parser
    }


def test_answers_carry_the_stop_reason_the_reasoning_and_its_tokens() -> None:
    by_id = {output["custom_id"]: output for output in answers(LineRules("m", "m", "error", GenerationConfig()))}
    body = by_id["thinks"]["response"]["body"]
    [choice] = body["choices"]
    assert choice["stop_reason"] == "###" and choice["message"]["content"] == "4"
    assert choice["message"]["reasoning"] == choice["message"]["reasoning_content"] == "two and two"
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    assert body["system_fingerprint"].startswith("flyteplugins-batcher-")


def test_a_required_tool_choice_cut_by_max_tokens_returns_the_calls_it_completed() -> None:
    by_id = {output["custom_id"]: output for output in answers(LineRules("m", "m", "error", GenerationConfig()))}
    [choice] = by_id["tools"]["response"]["body"]["choices"]
    assert choice["finish_reason"] == "length"  # it was cut: said so, not "tool_calls"
    [call] = choice["message"]["tool_calls"]  # the second was cut off
    assert call["function"] == {"name": "add", "arguments": '{"a": 2}'}  # as vLLM writes a required call's arguments
    assert choice["message"]["content"] is None


def fields(value: Any, prefix: str = "") -> set[str]:
    """Every field's path in a JSON value (list items merged), e.g. `response.body.choices.index`."""
    if isinstance(value, dict):
        return {
            path
            for key, item in value.items()
            for path in {f"{prefix}{key}"} | fields(item, f"{prefix}{key}.")
            if not path.startswith(("error.error", "response.body.choices.logprobs."))
        }
    if isinstance(value, list):
        return {path for item in value for path in fields(item, prefix)}
    return set()


def vllm_line(output: dict[str, Any]) -> None:
    """Validate a line with vLLM's `BatchRequestOutput`; a text completion's body with vLLM's `CompletionResponse`.

    vLLM 0.32's run-batch answers no `/v1/completions` line (it exits 1 on one), and its output type has no
    completion body: the envelope is validated with its type, the body with vLLM's own completion response.
    """
    body = (output.get("response") or {}).get("body")
    if isinstance(body, dict) and body.get("object") == "text_completion":
        from vllm.entrypoints.openai.completion.protocol import CompletionResponse

        CompletionResponse.model_validate(body)
        output = {**output, "response": {**output["response"], "body": None}}
    parsed = run_batch.BatchRequestOutput.model_validate(output)
    assert parsed.custom_id == output["custom_id"]
    kind = {"chat.completion": "ChatCompletionResponse", "list": "EmbeddingResponse"}.get((body or {}).get("object"))
    if kind is not None:  # the body was read as that response, not as another type of vLLM's union
        assert parsed.response is not None and type(parsed.response.body).__name__ == kind


class OpenAIResponse(pydantic.BaseModel):
    """OpenAI's `response` of a batch output line, its body one of the `openai` package's response types."""

    status_code: int
    request_id: str
    body: Any

    @pydantic.field_validator("body")
    @classmethod
    def _typed(cls, body: Any) -> Any:
        kinds = {
            "chat.completion": openai.types.chat.ChatCompletion,
            "text_completion": openai.types.Completion,
            "list": openai.types.CreateEmbeddingResponse,
        }
        return kinds[body["object"]].model_validate(body)


class OpenAIBatchLine(pydantic.BaseModel):
    """A line of OpenAI's batch output (and error) file: `error` is an `openai.types.BatchError`."""

    model_config = pydantic.ConfigDict(extra="forbid")

    id: str
    custom_id: str
    response: OpenAIResponse | None
    error: openai.types.BatchError | None
