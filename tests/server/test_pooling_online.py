"""vLLM's pooling routes on a real server: `/score`, `/v1/score`, `/rerank`, `/v1/rerank`, `/v2/rerank` with the
embedding model (all-MiniLM-L6-v2, cosine similarity), and with `/classify` on a server whose model is a
cross-encoder (tiny, random weights, on Transformers); online and as Batch API batches. Every answer is read by
vLLM's own response types."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, jsonl, wait_for_batch

pytestmark = pytest.mark.slow

scoring = pytest.importorskip("vllm.entrypoints.pooling.scoring.protocol", reason="needs vLLM (its response types)")
classify_protocol = pytest.importorskip("vllm.entrypoints.pooling.classify.protocol", reason="needs vLLM")

QUERY = "what is a cat"
DOCUMENTS = ["a cat is a small feline", "the stock market fell today", "kittens are young cats"]


def post(server: RunningServer, path: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def cosine(first: list[float], second: list[float]) -> float:
    dot = sum(a * b for a, b in zip(first, second, strict=True))
    return dot / math.sqrt(sum(a * a for a in first) * sum(b * b for b in second))


def test_score_and_rerank_with_the_embedding_model_are_cosine_similarities(smollm2_server: RunningServer) -> None:
    vectors = [item.embedding for item in smollm2_server.client().embeddings.create(
        model="all-MiniLM-L6-v2", input=[QUERY, *DOCUMENTS], encoding_format="float").data]  # fmt: skip
    expected = [cosine(vectors[0], vector) for vector in vectors[1:]]
    for path in ("/score", "/v1/score"):
        answer = post(smollm2_server, path, queries=QUERY, documents=DOCUMENTS)
        assert answer.status_code == 200, answer.text
        body = scoring.ScoreResponse.model_validate(answer.json())
        assert [item.score for item in body.data] == pytest.approx(expected, abs=1e-5)
        assert body.model == "all-MiniLM-L6-v2" and body.id.startswith("score-")
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        answer = post(smollm2_server, path, query=QUERY, documents=DOCUMENTS, top_n=2)
        ranked = scoring.RerankResponse.model_validate(answer.json())
        order = sorted(range(3), key=lambda index: -expected[index])[:2]
        assert [result.index for result in ranked.results] == order
        assert [result.document.text for result in ranked.results] == [DOCUMENTS[index] for index in order]


def test_pooling_requests_it_cannot_answer_are_400s_naming_why(smollm2_server: RunningServer) -> None:
    refused = post(smollm2_server, "/classify", input="a cat")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_url"
    assert "no served model can classify" in refused.json()["error"]["message"]
    generator = post(smollm2_server, "/score", model="SmolLM2-135M-Instruct", queries=QUERY, documents=DOCUMENTS)
    assert generator.status_code == 400 and generator.json()["error"]["code"] == "model_mismatch"
    assert "is a text generator: it cannot score" in generator.json()["error"]["message"]
    assert generator.json()["error"]["param"] == "model"
    long = post(smollm2_server, "/rerank", query=QUERY, documents=["word " * 400])
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
    unknown = post(smollm2_server, "/score", model="other", queries=QUERY, documents=DOCUMENTS)
    assert unknown.status_code == 404


def test_a_score_batch_through_the_official_client(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    lines = [
        {"custom_id": f"s{n}", "method": "POST", "url": "/v1/score", "body": {"queries": QUERY, "documents": [d]}}
        for n, d in enumerate(DOCUMENTS)
    ]
    uploaded = client.files.create(file=("score.jsonl", jsonl(lines)), purpose="batch")
    batch = wait_for_batch(client, client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/score", completion_window="24h").id)  # fmt: skip
    assert batch.status == "completed" and batch.model == "all-MiniLM-L6-v2" and batch.request_counts.completed == 3
    run_batch = pytest.importorskip("vllm.entrypoints.launchers.run_batch")
    answered = [json.loads(text) for text in client.files.content(batch.output_file_id).text.splitlines()]
    for line in answered:
        run_batch.BatchRequestOutput.model_validate(line)
    online = post(smollm2_server, "/v1/score", queries=QUERY, documents=DOCUMENTS).json()["data"]
    by_id = {line["custom_id"]: line["response"]["body"]["data"][0]["score"] for line in answered}
    assert [by_id[f"s{n}"] for n in range(3)] == pytest.approx([item["score"] for item in online], abs=1e-6)


def test_a_server_whose_model_is_a_cross_encoder_scores_reranks_and_classifies(
    start: Any, pooling_models: dict[str, str]
) -> None:
    server = start("--model", pooling_models["cross_encoder"], "--engine", "transformers", "--no-embeddings")
    scores = scoring.ScoreResponse.model_validate(post(server, "/score", text_1=QUERY, text_2=DOCUMENTS).json())
    assert scores.model == "cross_encoder" and len({round(item.score, 6) for item in scores.data}) == 3
    ranked = scoring.RerankResponse.model_validate(post(server, "/v2/rerank", query=QUERY, documents=DOCUMENTS).json())
    assert sorted(result.relevance_score for result in ranked.results) == sorted(item.score for item in scores.data)
    classes = classify_protocol.ClassificationResponse.model_validate(post(server, "/classify", input=DOCUMENTS).json())
    assert [item.num_classes for item in classes.data] == [1, 1, 1] and classes.data[0].label == "LABEL_0"
    assert [model.id for model in server.client().models.list().data] == ["cross_encoder"]
    chat = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and "is a classifier: it does not generate text" in chat.json()["error"]["message"]
    client = server.client()
    lines = [{"custom_id": "c", "method": "POST", "url": "/classify", "body": {"input": DOCUMENTS}}]
    uploaded = client.files.create(file=("classify.jsonl", jsonl(lines)), purpose="batch")
    batch = wait_for_batch(client, client.batches.create(
        input_file_id=uploaded.id, endpoint="/classify", completion_window="24h").id)  # fmt: skip
    [answer] = [json.loads(text) for text in client.files.content(batch.output_file_id).text.splitlines()]
    body = classify_protocol.ClassificationResponse.model_validate(answer["response"]["body"])
    assert [item.probs for item in body.data] == [item.probs for item in classes.data]
