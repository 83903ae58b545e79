"""One batch file through vLLM's own `run_batch` and through `flyteplugins-batcher run-batch --engine vllm`, on vLLM's
CPU build with the same engine arguments and two LoRA adapters made with peft: the answers must agree.

Three traps of vLLM 0.32 shape how vLLM is asked (ours answers every line in one run):

- its `run_batch` takes no `/v1/completions` lines (the whole run fails), so completions' logprobs are
  checked against `LLM.generate`;
- it refuses named and required tool choices (it wires no tool parser), so our tool calls are checked
  by their schema;
- its CPU build answers base-model lines with an adapter's weights when they share a step with adapter
  lines (its CPU LoRA kernels take slot -1, the last slot, for "no adapter"), so vLLM's base lines
  come from a run without adapters, and its adapter lines from a run of adapter lines only. Ours
  runs base lines beside adapter lines and must answer them as the base model alone.

So vLLM starts four times: ours, vLLM's base lines, its adapter lines, `LLM.generate`. Each start is a
fixture of its own, and each test asks only for the runs it compares, so that no test waits for more
than two starts (and the session's adapters) under its timeout, a start's each (`engine_starts`),
whatever order the tests run in, on a busy machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")

from flyteplugins_batcher.engines import bundled_smollm2_path
from tests.conftest import REPO_ROOT
from tests.lora_adapters import RANK, lora_flag

pytestmark = [pytest.mark.slow, pytest.mark.engine_starts(3)]

KV_CACHE_BYTES = 1 << 30
ENGINE_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "1024", "--max-num-seqs", "8"]
"""The engine arguments both runs get (vLLM's flags; ours takes the same names)."""

QUESTIONS = ["What is 2 + 2?", "Name three primary colors.", "Write one sentence about the ocean."]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
YEAR = "(19|20)[0-9]{2}"
PROMPTS = ["The capital of France is", "1, 2, 3, 4,"]
LOGPROB_TOLERANCE = 0.05


def chat(custom_id: str, question: str, **body: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 16, "temperature": 0, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


BASE_LINES = [chat(f"base-{n}", question, logprobs=True, top_logprobs=2) for n, question in enumerate(QUESTIONS)]
ADAPTER_LINES = [
    chat(f"{name}-{n}", question, model=name, logprobs=True)
    for name in ("alpha", "beta")
    for n, question in enumerate(QUESTIONS[:2])
]
STRUCTURED_LINES = [
    chat("choice", "Is the sky blue?", structured_outputs={"choice": ["yes", "no"]}),
    chat("regex", "In which year did the Berlin wall fall?", structured_outputs={"regex": YEAR}),
]
OURS_ONLY = [
    chat(
        "named", "Weather in Paris?", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}
    ),
    chat("required", "Weather in Oslo?", tools=TOOLS, tool_choice="required", max_tokens=48),
    *(
        {"custom_id": f"cmpl-{n}", "url": "/v1/completions", "body": {"prompt": p, "max_tokens": 8, "logprobs": 2}}
        for n, p in enumerate(PROMPTS)
    ),
]


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def results(path: Path) -> dict[str, dict[str, Any]]:
    """Each answered line's response body, by custom_id."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {line["custom_id"]: line["response"]["body"] for line in lines if line.get("response")}


def environment() -> dict[str, str]:
    """This process's environment, offline, with this checkout first on the path (the tests run from elsewhere)."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def run(*command: str, cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


def vllm_run_batch(folder: Path, name: str, lines: list[dict[str, Any]], *flags: str) -> dict[str, dict[str, Any]]:
    source, output = write(folder / f"{name}.jsonl", lines), folder / f"{name}-out.jsonl"
    model = str(bundled_smollm2_path())
    kv = ["--kv-cache-memory-bytes", str(KV_CACHE_BYTES)]
    run(sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source), "-o", str(output), "--model",
        model, *ENGINE_FLAGS, *kv, *flags, cwd=folder)  # fmt: skip
    return results(output)


def vllm_generate(folder: Path) -> list[dict[str, Any]]:
    """What `LLM.generate` gives the completion prompts: each token's id, logprob and decoded text."""
    script = textwrap.dedent(
        f"""
        import json, sys
        from vllm import LLM, SamplingParams

        if __name__ == "__main__":
            llm = LLM({str(bundled_smollm2_path())!r}, dtype="float32", enforce_eager=True, max_model_len=1024,
                      max_num_seqs=8, kv_cache_memory_bytes={KV_CACHE_BYTES})
            outputs = llm.generate({PROMPTS!r}, SamplingParams(temperature=0, max_tokens=8, logprobs=2), use_tqdm=False)
            shaped = [
                [[token, step[token].logprob, step[token].decoded_token] for token, step in zip(o.outputs[0].token_ids,
                 o.outputs[0].logprobs)] for o in outputs
            ]
            print("RESULT " + json.dumps(shaped))
        """
    )
    (folder / "generate.py").write_text(script)
    done = subprocess.run(
        [sys.executable, "generate.py"], cwd=folder, env=environment(), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-5000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity")


@pytest.fixture(scope="module")
def ours(folder: Path, lora_adapters: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Our run-batch, one run of every line: base lines beside adapter lines, and the lines vLLM's run_batch refuses."""
    source = write(
        folder / "ours.jsonl", ADAPTER_LINES[:2] + BASE_LINES + ADAPTER_LINES[2:] + STRUCTURED_LINES + OURS_ONLY
    )
    engine = ["--engine", "vllm", "--model", str(bundled_smollm2_path()), *ENGINE_FLAGS]
    kv = ["--engine-args", json.dumps({"kv_cache_memory_bytes": KV_CACHE_BYTES})]
    adapters = lora_flag(lora_adapters)
    command = ["run-batch", "-i", str(source), "-o", str(folder / "ours"), *engine, *kv, *adapters, "--no-resume"]
    run(sys.executable, "-m", "flyteplugins_batcher", *command, cwd=folder)
    assert (folder / "ours" / "errors.jsonl").read_text() == ""
    return results(folder / "ours" / "results.jsonl")


@pytest.fixture(scope="module")
def vllm_base(folder: Path) -> dict[str, dict[str, Any]]:
    """vLLM's run_batch of the base and structured lines, without adapters."""
    return vllm_run_batch(folder, "vllm-base", BASE_LINES + STRUCTURED_LINES)


@pytest.fixture(scope="module")
def vllm_adapters(folder: Path, lora_adapters: dict[str, str]) -> dict[str, dict[str, Any]]:
    """vLLM's run_batch of the adapter lines alone."""
    lora = ["--enable-lora", "--max-loras", "2", "--max-lora-rank", str(RANK), *lora_flag(lora_adapters)]
    return vllm_run_batch(folder, "vllm-adapters", ADAPTER_LINES, *lora)


@pytest.fixture(scope="module")
def generated(folder: Path) -> list[dict[str, Any]]:
    """`LLM.generate`'s answers to the completion prompts."""
    return vllm_generate(folder)


def chosen(body: dict[str, Any]) -> list[tuple[str, float]]:
    return [(item["token"], item["logprob"]) for item in body["choices"][0]["logprobs"]["content"]]


def assert_same_greedy_answer(ours: dict[str, Any], theirs: dict[str, Any], custom_id: str) -> None:
    assert ours["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"]
    assert [token for token, _ in chosen(ours)] == [token for token, _ in chosen(theirs)]
    for (_, mine), (_, vllms) in zip(chosen(ours), chosen(theirs), strict=True):
        assert mine == pytest.approx(vllms, abs=LOGPROB_TOLERANCE)
    if not custom_id.startswith("base"):
        assert ours["model"] == theirs["model"] == custom_id.split("-")[0]  # the adapter answered
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [ours["usage"][key] for key in counts] == [theirs["usage"][key] for key in counts]


@pytest.mark.parametrize("custom_id", [line["custom_id"] for line in BASE_LINES])
def test_base_lines_beside_adapter_lines_answer_as_vllms_base_model_token_for_token(
    ours: dict[str, Any], vllm_base: dict[str, Any], custom_id: str
) -> None:
    assert_same_greedy_answer(ours[custom_id], vllm_base[custom_id], custom_id)


@pytest.mark.parametrize("custom_id", [line["custom_id"] for line in ADAPTER_LINES])
def test_adapter_lines_answer_as_vllms_adapters_token_for_token(
    ours: dict[str, Any], vllm_adapters: dict[str, Any], custom_id: str
) -> None:
    assert_same_greedy_answer(ours[custom_id], vllm_adapters[custom_id], custom_id)


def test_adapters_change_the_answer_and_base_lines_beside_them_answer_as_the_base_model(ours: dict[str, Any]) -> None:
    texts = {name: ours[f"{name}-0"]["choices"][0]["message"]["content"] for name in ("base", "alpha", "beta")}
    assert len(set(texts.values())) == 3, texts
    assert ours["alpha-0"]["model"] == "alpha" and ours["base-0"]["model"] not in ("alpha", "beta")


def test_choice_and_regex_are_obeyed_as_vllm_obeys_them(ours: dict[str, Any], vllm_base: dict[str, Any]) -> None:
    import re

    for custom_id in ("choice", "regex"):
        text = ours[custom_id]["choices"][0]["message"]["content"]
        assert text == vllm_base[custom_id]["choices"][0]["message"]["content"]
    assert ours["choice"]["choices"][0]["message"]["content"] in ("yes", "no")
    assert re.fullmatch(YEAR, ours["regex"]["choices"][0]["message"]["content"])


def test_named_and_required_tool_calls_name_the_tool_with_arguments_that_follow_its_schema(
    ours: dict[str, Any],
) -> None:
    for custom_id in ("named", "required"):
        choice = ours[custom_id]["choices"][0]
        calls = choice["message"]["tool_calls"]
        assert calls and all(call["function"]["name"] == "get_weather" for call in calls)
        for call in calls:
            arguments = json.loads(call["function"]["arguments"])
            assert isinstance(arguments, dict) and isinstance(arguments["city"], str)
        assert choice["finish_reason"] == ("stop" if custom_id == "named" else "tool_calls")


def test_completions_logprobs_equal_llm_generates(ours: dict[str, Any], generated: list[dict[str, Any]]) -> None:
    for n, steps in enumerate(generated):
        logprobs = ours[f"cmpl-{n}"]["choices"][0]["logprobs"]
        assert logprobs["tokens"] == [decoded for _, _, decoded in steps]
        assert logprobs["token_logprobs"] == pytest.approx([value for _, value, _ in steps], abs=LOGPROB_TOLERANCE)
        assert all(len(top) >= 2 for top in logprobs["top_logprobs"])
