"""`run-batch` against the real `vllm run-batch` (`python -m vllm.entrypoints.openai.run_batch`, vLLM's CPU build,
the bundled SmolLM2): the same files and flags, the same exit codes and output lines.

- an empty file: both exit 0 and write an empty output file;
- a file with bad lines (an unknown model, a url neither serves): both exit 0 and answer each line in its
  place, in input order, with `-o FILE`; our lines carry every field of vLLM's, and validate as vLLM's
  `BatchRequestOutput`; with `--reasoning-parser qwen3` both take the same reasoning out of a few-shot
  answer and count the same reasoning tokens;
- a line that is not JSON, a line without `custom_id`: vLLM 0.32 stops the whole run (exit 1, no output),
  where ours exits 0 and fails that line alone, with a string `custom_id`: a deliberate difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")

from flyteplugins_batcher.engines import bundled_smollm2_path
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.engine_starts(8)]  # 4 files, each through both commands

MODEL = str(bundled_smollm2_path())
ENGINE_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "1024", "--max-num-seqs", "8"]
"""vLLM's flags, which both commands take (benchmarks/bench_table.py's, smaller)."""

FEW_SHOT = [
    {"role": "system", "content": "You think inside <think></think> tags, then answer."},
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "<think>3 plus 4 makes 7.</think>7"},
    {"role": "user", "content": "What is 5 + 1?"},
    {"role": "assistant", "content": "<think>5 plus 1 makes 6.</think>6"},
    {"role": "user", "content": "What is 2 + 6?"},
]


def chat(custom_id: str | None, messages: list[dict[str, str]], **body: Any) -> str:
    line = {"method": "POST", "url": "/v1/chat/completions"}
    line["body"] = {"model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0, **body}
    return json.dumps(line if custom_id is None else {"custom_id": custom_id, **line})


def ask(custom_id: str | None, question: str = "Say hello.", **body: Any) -> str:
    return chat(custom_id, [{"role": "user", "content": question}], **body)


FILES = {
    "empty": [],
    "bad-lines": [
        chat("think", FEW_SHOT),
        ask("unknown-model", model="no-such-model"),
        ask("hello"),
        ask("bad-url").replace("/v1/chat/completions", "/v1/nothing"),
        ask("prime", "Name a prime number."),
    ],
    "not-json": [ask("hello"), '{"custom_id": "broken", "method": "POST", '],
    "no-custom-id": [ask("hello"), ask(None)],
}
"""Each file both commands run, by name."""


def environment() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def run(command: list[str], folder: Path) -> tuple[int, list[dict[str, Any]] | None]:
    """The command's exit code, and the lines of its output file (`None` where it wrote none)."""
    output = Path(command[command.index("-o") + 1])
    done = subprocess.run(command, cwd=folder, env=environment(), capture_output=True, text=True, timeout=900)
    written = [json.loads(line) for line in output.read_text().splitlines()] if output.exists() else None
    return done.returncode, written


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, tuple[int, Any]]]:
    """Each file through `vllm run-batch` and through ours (-o FILE both), by file name, then "vllm" or "ours"."""
    folder = tmp_path_factory.mktemp("contract")
    found: dict[str, dict[str, tuple[int, Any]]] = {}
    for name, lines in FILES.items():
        source = folder / f"{name}.jsonl"
        source.write_text("".join(f"{line}\n" for line in lines))
        vllm = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source)]
        vllm += ["-o", str(folder / f"{name}-vllm.jsonl"), "--model", MODEL, *ENGINE_FLAGS]
        vllm += ["--kv-cache-memory-bytes", str(1 << 30), "--reasoning-parser", "qwen3"]
        ours = [sys.executable, "-m", "flyteplugins_batcher", "run-batch", "-i", str(source)]
        ours += ["-o", str(folder / f"{name}-ours.jsonl"), "--model", MODEL, *ENGINE_FLAGS, "--no-resume"]
        ours += ["--engine", "vllm", "--kv-cache-gb", "1", "--reasoning-parser", "qwen3"]
        found[name] = {"vllm": run(vllm, folder), "ours": run(ours, folder)}
    return found


def test_an_empty_file_exits_0_with_an_empty_output_as_vllms_does(outcomes: dict[str, Any]):
    assert outcomes["empty"]["vllm"] == (0, [])
    assert outcomes["empty"]["ours"] == (0, [])


def test_bad_lines_are_answered_in_their_places_and_the_run_exits_0_as_vllms_does(outcomes: dict[str, Any]):
    (vllm_code, theirs), (our_code, ours) = outcomes["bad-lines"]["vllm"], outcomes["bad-lines"]["ours"]
    assert (vllm_code, our_code) == (0, 0)
    order = ["think", "unknown-model", "hello", "bad-url", "prime"]
    assert [line["custom_id"] for line in theirs] == [line["custom_id"] for line in ours] == order
    failed = [line["custom_id"] for line in ours if line["error"] is not None]
    assert failed == [line["custom_id"] for line in theirs if line["error"] is not None] == ["unknown-model", "bad-url"]
    from vllm.entrypoints.launchers.run_batch import BatchRequestOutput

    for line in ours:
        BatchRequestOutput.model_validate(line)
    vllm_answer, our_answer = theirs[2]["response"]["body"], ours[2]["response"]["body"]
    assert our_answer["model"] == vllm_answer["model"] == MODEL  # --model echoed as given
    assert set(our_answer) >= set(vllm_answer)
    assert set(our_answer["choices"][0]) >= set(vllm_answer["choices"][0])
    assert set(our_answer["choices"][0]["message"]) >= set(vllm_answer["choices"][0]["message"])


def test_a_reasoning_parser_takes_out_the_reasoning_vllms_does_and_counts_its_tokens(outcomes: dict[str, Any]):
    theirs, ours = outcomes["bad-lines"]["vllm"][1][0], outcomes["bad-lines"]["ours"][1][0]
    vllm_body, our_body = theirs["response"]["body"], ours["response"]["body"]
    vllm_message, our_message = vllm_body["choices"][0]["message"], our_body["choices"][0]["message"]
    assert "2 plus 6" in our_message["reasoning"] and our_message["content"].strip() == "8"
    assert (our_message["reasoning"], our_message["content"]) == (vllm_message["reasoning"], vllm_message["content"])
    assert our_message["reasoning_content"] == our_message["reasoning"]
    reasoning_tokens = vllm_body["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert our_body["usage"]["completion_tokens_details"]["reasoning_tokens"] == reasoning_tokens > 0


@pytest.mark.parametrize(("name", "custom_id", "code"), [("not-json", "line-2", "invalid_json"),
                                                         ("no-custom-id", "line-2", "missing_custom_id")])  # fmt: skip
def test_a_line_vllm_stops_at_fails_alone_here_with_a_string_id(
    outcomes: dict[str, Any], name: str, custom_id: str, code: str
):
    assert outcomes[name]["vllm"] == (1, None)  # vLLM 0.32: a validation error ends the run, nothing written
    our_code, ours = outcomes[name]["ours"]
    assert our_code == 0
    assert [(line["custom_id"], (line["error"] or {}).get("code")) for line in ours] == [
        ("hello", None),
        (custom_id, code),
    ]
