"""How the server starts: with real vLLM as in the workflows, and not at all (at once, saying why) when it cannot."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from benchmarks.server_process import REPO_ROOT, free_port
from tests.server.conftest import chat_line, jsonl, wait_for_batch

pytestmark = pytest.mark.slow


def test_vllm_serves_concurrent_clients_and_batches_in_stream_mode(start) -> None:
    pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
    server = start(
        *("--engine", "vllm", "--no-embeddings", "--max-new-tokens", "16"),
        *("--max-model-len", "1024", "--kv-cache-gb", "1"),
    )
    client = server.client()
    messages = [[{"role": "user", "content": f"What is {n} + {n}?"}] for n in range(8)]

    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda m: client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=m), messages)
        )
    document = " ".join(f"Fact {n}: item {n} weighs {n * 7 % 97} grams." for n in range(40))  # a prefix they share
    lines = [chat_line(f"r{n}", f"{document}\nName the number {n}.") for n in range(6)]
    input_id = client.files.create(file=("r.jsonl", io.BytesIO(jsonl(lines))), purpose="batch").id
    batch = wait_for_batch(
        client,
        client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="1h").id,
    )
    metrics = server.metrics()

    assert all(answer.choices[0].message.content and answer.usage.completion_tokens <= 16 for answer in answers)
    assert batch.status == "completed" and batch.request_counts.completed == 6
    assert metrics["batcher_engine_steps_total{}"] > 0 and metrics["batcher_engine_max_num_seqs{}"] > 0
    assert 0 < metrics["batcher_engine_occupancy_ratio{}"] <= 1  # vLLM's own scheduler statistics
    generated = sum(answer.usage.completion_tokens for answer in answers) + batch.usage.output_tokens
    assert metrics["batcher_engine_generation_tokens_total{}"] == generated
    results = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    cached = [line["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for line in results]
    assert batch.usage.input_tokens_details.cached_tokens == sum(cached) > 0  # vLLM computed the document once
    online_cached = sum(answer.usage.prompt_tokens_details.cached_tokens for answer in answers)
    assert metrics["batcher_engine_prompt_tokens_cached_total{}"] == online_cached + sum(cached)


def test_a_server_whose_model_cannot_load_exits_at_once_saying_why(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "flyteplugins_batcher",
        "serve",
        "--port",
        str(free_port()),
        "--data-dir",
        str(tmp_path),
    ]

    finished = subprocess.run(
        [*command, "--model", str(tmp_path / "no-such-model"), "--no-embeddings"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert finished.returncode != 0
    assert "does not exist" in finished.stdout + finished.stderr
    assert "the server did not start" in finished.stderr
