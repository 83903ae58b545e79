"""Our server on the vLLM engine against vLLM's own server, both with two peft LoRA adapters, through the official
`openai` client: logprobs (streamed too), adapters, completions' logprobs, structured outputs and a named tool.

Requests go one at a time, so that vLLM's CPU build never runs a base-model request in a step with an
adapter's (it would answer it with an adapter's weights: see `tests/jobs/test_run_batch_vllm_parity.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.server_process import vllm_server
from tests.lora_adapters import RANK, lora_flag
from tests.server.conftest import start_server

openai = pytest.importorskip("openai", reason="needs the test extra")
pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")

pytestmark = [pytest.mark.slow, pytest.mark.engine_starts(3)]  # ours, vLLM's own server, the session's adapters

QUESTION = [{"role": "user", "content": "Name three primary colors."}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
ENGINE = ["--dtype", "float32", "--max-model-len", "1024"]
"""The engine arguments both servers get (vLLM's flags; ours takes the same names), and 8 sequences per step."""
TOLERANCE = 0.05


def client_of(server: Any) -> Any:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300.0)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, lora_adapters: dict[str, str]) -> Iterator[dict[str, Any]]:
    from flyteplugins_batcher.engines import bundled_smollm2_path

    folder, model = tmp_path_factory.mktemp("vllm-fields"), str(bundled_smollm2_path())
    adapters = lora_flag(lora_adapters)
    parser = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
    ours = start_server(
        folder / "ours", "--engine", "vllm", "--model", model, "--no-embeddings", "--kv-cache-gb", "1", *ENGINE,
        "--engine-args", json.dumps({"max_num_seqs": 8}), *adapters, *parser,
    )  # fmt: skip
    try:
        lora = ["--enable-lora", "--max-loras", "2", "--max-lora-rank", str(RANK)]
        kv = ["--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager"]
        theirs = vllm_server(folder / "vllm", model, *ENGINE, "--max-num-seqs", "8", *kv, *lora, *adapters, *parser)
    except BaseException:
        ours.stop()
        raise
    yield {"ours": ours, "theirs": theirs, "model": model}
    ours.stop()
    theirs.stop()


def chosen(answer: Any) -> list[tuple[str, float]]:
    return [(item.token, item.logprob) for item in answer.choices[0].logprobs.content]


def assert_close(ours: list[tuple[str, float]], theirs: list[tuple[str, float]]) -> None:
    assert [token for token, _ in ours] == [token for token, _ in theirs]
    assert [value for _, value in ours] == pytest.approx([value for _, value in theirs], abs=TOLERANCE)


def served_names(server: Any) -> dict[str, str]:
    """The name each server gives the base model and each adapter."""
    listed = [model.id for model in client_of(server).models.list().data]
    return {"base": next(name for name in listed if name not in ("alpha", "beta")), "alpha": "alpha", "beta": "beta"}


@pytest.mark.parametrize("model", ["base", "alpha", "beta"])
def test_chat_answers_and_logprobs_equal_vllm_serves_streamed_or_not(servers: dict[str, Any], model: str) -> None:
    answers = {}
    for side in ("ours", "theirs"):
        client, name = client_of(servers[side]), served_names(servers[side])[model]
        whole = client.chat.completions.create(
            model=name, messages=QUESTION, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2
        )
        stream = client.chat.completions.create(
            model=name, messages=QUESTION, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2, stream=True
        )
        streamed = [
            (i.token, i.logprob) for c in stream for ch in c.choices if ch.logprobs for i in ch.logprobs.content
        ]
        assert_close(streamed, chosen(whole))
        assert whole.model == name
        answers[side] = whole
    assert answers["ours"].choices[0].message.content == answers["theirs"].choices[0].message.content
    assert_close(chosen(answers["ours"]), chosen(answers["theirs"]))


def test_completions_logprobs_equal_vllm_serves(servers: dict[str, Any]) -> None:
    answers = {}
    for side in ("ours", "theirs"):
        name = served_names(servers[side])["alpha"]
        answers[side] = client_of(servers[side]).completions.create(
            model=name, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2
        )
    ours, theirs = (answers[side].choices[0] for side in ("ours", "theirs"))
    assert ours.text == theirs.text and ours.logprobs.tokens == theirs.logprobs.tokens
    assert ours.logprobs.token_logprobs == pytest.approx(theirs.logprobs.token_logprobs, abs=TOLERANCE)
    assert ours.logprobs.text_offset == theirs.logprobs.text_offset


def test_structured_outputs_and_a_named_tool_equal_vllm_serves(servers: dict[str, Any]) -> None:
    answers: dict[str, list[Any]] = {}
    for side in ("ours", "theirs"):
        client, name = client_of(servers[side]), served_names(servers[side])["base"]
        ask = {"model": name, "max_tokens": 24, "temperature": 0}
        answers[side] = [
            client.chat.completions.create(
                messages=QUESTION, extra_body={"structured_outputs": {"choice": ["red", "blue"]}}, **ask
            ),
            client.chat.completions.create(
                messages=QUESTION, extra_body={"structured_outputs": {"regex": "[A-Z][a-z]+"}}, **ask
            ),
            client.chat.completions.create(
                messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
                **{**ask, "max_tokens": 64},
            ),
        ]
    (choice, regex, tool), (their_choice, their_regex, their_tool) = answers["ours"], answers["theirs"]
    assert choice.choices[0].message.content == their_choice.choices[0].message.content in ("red", "blue")
    assert regex.choices[0].message.content == their_regex.choices[0].message.content
    shown = f"ours: {tool.choices[0]}; vLLM's: {their_tool.choices[0]}"
    [call], [their_call] = (
        tool.choices[0].message.tool_calls or [None],
        their_tool.choices[0].message.tool_calls or [None],
    )
    assert call is not None and their_call is not None, shown
    # vLLM's hermes parser has a named call written in its own `<tool_call>` format, unconstrained (SmolLM2 writes
    # its arguments there as a string); ours decodes the arguments alone under the tool's schema, as vLLM does
    # without a parser: the same call, and only ours is sure to follow the schema.
    assert call.function.name == their_call.function.name == "get_weather", shown
    assert isinstance(json.loads(call.function.arguments)["city"], str), shown
    json.loads(their_call.function.arguments)


def test_both_list_the_adapters(servers: dict[str, Any]) -> None:
    for side in ("ours", "theirs"):
        listed = {model.id for model in client_of(servers[side]).models.list().data}
        assert {"alpha", "beta"} <= listed and len(listed) == 3
