"""Two real base models in one batch file (issue 35): the bundled SmolLM2 and a second checkpoint made from it (a seeded
LoRA adapter merged into its weights, `benchmarks/_lora_models.py`), with two LoRA adapters on the first.

Through flyte's local runner, on Transformers and on vLLM's CPU build: the run loads each model once, never holds
both, answers every line as a run of that model alone answers it, and names each line's model in its result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flyte.io import File

from flyteplugins_batcher.engines import bundled_smollm2_path
from flyteplugins_batcher.jobs import RunSummary, run_batch_file
from flyteplugins_batcher.replica import LLMReplica
from tests.jobs.conftest import EngineLog, Replicas, close_on_its_loop
from tests.lora_adapters import make_merged_model

pytestmark = pytest.mark.slow

QUESTIONS = ["What is 2 + 2?", "Name three primary colors.", "Write one sentence about the ocean."]
ENGINES = {
    "transformers": {"engine": "transformers", "dtype": "float32"},
    "vllm": {
        "engine": "vllm",
        "dtype": "float32",
        "enforce_eager": "true",
        "max_model_len": 1024,
        "engine_args": json.dumps({"max_num_seqs": 8, "kv_cache_memory_bytes": 1 << 30}),
    },
}


@pytest.fixture(scope="module")
def merged_model(tmp_path_factory: pytest.TempPathFactory, lora_adapters: dict[str, str]) -> str:
    """The second base model: the bundled SmolLM2 with a seeded random adapter merged in (made for this module)."""
    return make_merged_model(tmp_path_factory.mktemp("merged") / "smollm2-merged", str(bundled_smollm2_path()))


def chat(custom_id: str, question: str, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 12, "temperature": 0}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def lines(merged: str) -> list[dict[str, Any]]:
    """Base, merged and adapter lines, interleaved (the merged model's come first in the file)."""
    base = str(bundled_smollm2_path())
    interleaved = []
    for number, question in enumerate(QUESTIONS):
        interleaved += [chat(f"merged-{number}", question, merged), chat(f"base-{number}", question, base)]
        interleaved += [chat(f"{name}-{number}", question, name) for name in ("alpha", "beta") if number < 2]
    return interleaved


def run(
    run_locally: Any,
    folder: Path,
    requests: list[dict[str, Any]],
    models: list[str],
    adapters: dict[str, str],
    **engine,
) -> tuple[RunSummary, dict[str, dict[str, Any]]]:
    folder.mkdir()
    source = folder / "requests.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in requests))
    lora = "\n".join(f"{name}={path}" for name, path in adapters.items())
    summary: RunSummary = run_locally(
        run_batch_file,
        input=File.from_local_sync(str(source)),
        output_dir=str(folder / "out"),
        model="\n".join(models),
        lora_modules=lora,
        chunk_size=2,
        resume=False,
        **engine,
    )
    assert (folder / "out" / "errors.jsonl").read_text() == ""
    answers = [json.loads(line) for line in (folder / "out" / "results.jsonl").read_text().splitlines()]
    return summary, {answer["custom_id"]: answer["response"]["body"] for answer in answers}


@pytest.mark.engine_starts(6)  # four loads (two in the run, each model alone), the merged model, the adapters
@pytest.mark.parametrize("engine", list(ENGINES))
def test_two_checkpoints_time_share_a_replica_and_answer_as_each_alone(
    run_locally: Any, replicas: Replicas, tmp_path: Path, merged_model: str, lora_adapters: dict[str, str], engine: str
) -> None:
    if engine == "vllm":
        pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
    base, requests, settings = str(bundled_smollm2_path()), lines(merged_model), ENGINES[engine]
    log = EngineLog()
    replica = replicas.use(LLMReplica(log.make))
    summary, together = run(run_locally, tmp_path / "both", requests, [base, merged_model], lora_adapters, **settings)

    assert replica.loads == {base: 1, merged_model: 1} and log.most_loaded == 1
    models = [model for model, _ in log.answered]
    merged_names = {merged_model, "smollm2-merged"}  # a model answers to its reference as given and its short name
    assert models[0] in merged_names and models == sorted(models, key=lambda model: model not in merged_names)
    assert [(part.model, part.requests) for part in summary.models] == [(merged_model, 3), (base, 7)]  # as given
    assert all(part.load_time_s > 0 and part.wall_s > part.load_time_s for part in summary.models)

    close_on_its_loop(replica)  # one engine in memory at a time, here too
    replicas.use(LLMReplica())
    mine = [line for line in requests if not line["custom_id"].startswith("merged")]
    _, base_alone = run(run_locally, tmp_path / "base", mine, [base], lora_adapters, **settings)
    close_on_its_loop(replicas.used[-1])
    replicas.use(LLMReplica())
    theirs = [line for line in requests if line["custom_id"].startswith("merged")]
    _, merged_alone = run(run_locally, tmp_path / "merged", theirs, [merged_model], {}, **settings)

    alone = base_alone | merged_alone
    assert set(together) == set(alone) == {line["custom_id"] for line in requests}
    for custom_id, body in together.items():
        assert body["choices"][0]["message"]["content"] == alone[custom_id]["choices"][0]["message"]["content"]
        assert body["model"] == alone[custom_id]["model"]
    assert together["merged-0"]["model"] == merged_model and together["alpha-0"]["model"] == "alpha"  # as given
    texts = {together[f"{name}-0"]["choices"][0]["message"]["content"] for name in ("base", "merged", "alpha")}
    assert len(texts) == 3, texts  # three models' answers
