"""vLLM's pooling lines (score, rerank, classify): read as vLLM reads them, answered in its shapes, bad ones refused.

Every answer is validated by vLLM's own response types (`ScoreResponse`, `RerankResponse`,
`ClassificationResponse`) and its batch output line (`BatchRequestOutput`), imported from the vLLM
installed here; every line is also validated as vLLM's `BatchRequestInput` reads it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from flyteplugins_batcher.batch_api import (
    ENDPOINTS,
    EmbeddingRequest,
    RequestLineError,
    embedding_response_line,
    parse_request_line,
)

ENCODERS = {"all-MiniLM-L6-v2": ("embed", "score", "rerank"), "ce": ("score", "rerank", "classify")}


def line(url: str, custom_id: str = "p1", **body: Any) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def parse(text: str, **checks: Any) -> EmbeddingRequest:
    checks = {"endpoints": ENDPOINTS, "served_model": "SmolLM2", "encoder_tasks": ENCODERS, **checks}
    request = parse_request_line(text, 3, **checks)
    assert isinstance(request, EmbeddingRequest)
    return request


def failure(text: str, **checks: Any) -> RequestLineError:
    with pytest.raises(RequestLineError) as raised:
        parse(text, **checks)
    assert raised.value.custom_id == "p1" and raised.value.line == 3
    return raised.value


@pytest.mark.parametrize(
    ("url", "sides"),
    [
        ("/score", {"queries": "q", "documents": ["a", "b"]}),
        ("/v1/score", {"queries": "q", "items": ["a", "b"]}),
        ("/score", {"data_1": ["q"], "data_2": ["a", "b"]}),
        ("/v1/score", {"text_1": "q", "text_2": ["a", "b"]}),
    ],
)
def test_a_score_line_reads_every_spelling_of_its_two_sides_as_vllm_does(url: str, sides: dict[str, Any]):
    request = parse(line(url, model="ce", **sides))
    assert (request.task, request.queries, request.inputs, request.model) == ("score", ("q",), ("a", "b"), "ce")
    assert request.pairs == (("q", "a"), ("q", "b"))


def test_n_queries_go_with_n_documents_and_other_lengths_fail_naming_both_fields():
    assert parse(line("/score", text_1=["q1", "q2"], text_2=["a", "b"])).pairs == (("q1", "a"), ("q2", "b"))
    error = failure(line("/score", text_1=["q1", "q2"], text_2=["a", "b", "c"]))
    assert error.code == "invalid_body"
    assert error.message == "body.text_1 has 2 texts and body.text_2 3: the lengths must be 1:1, 1:N or N:N"


def test_a_rerank_line_and_a_classify_line():
    for url in ("/rerank", "/v1/rerank", "/v2/rerank"):
        request = parse(line(url, query="q", documents=["a", "b", "c"], top_n=2))
        assert (request.task, request.queries, request.inputs, request.top_n) == ("rerank", ("q",), ("a", "b", "c"), 2)
    request = parse(line("/classify", input=["good", "bad"], use_activation=False))
    assert (request.task, request.inputs, request.use_activation) == ("classify", ("good", "bad"), False)


@pytest.mark.parametrize(
    ("url", "body", "code", "message"),
    [
        ("/score", {"queries": "q"}, "invalid_body", "a score request needs two sides to score: one of queries/"),
        ("/score", {"queries": "q", "documents": []}, "invalid_body", "body.documents must be a non-empty string"),
        ("/score", {"queries": "q", "documents": ["a", " "]}, "invalid_body", "body.documents[1] is empty"),
        ("/score", {"queries": [1, 2], "documents": "a"}, "invalid_body", "body.queries: token-id arrays"),
        (
            "/score",
            {"queries": {"content": [{"type": "image_url"}]}, "documents": "a"},
            "invalid_body",
            "body.queries must hold only strings (multimodal content is not supported)",
        ),
        ("/rerank", {"documents": ["a"]}, "invalid_body", "body.query must be a non-empty string (one query)"),
        ("/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, "invalid_request", "body.top_n must be >= 0"),
        ("/classify", {"input": ["a"], "use_activation": "yes"}, "invalid_request", "body.use_activation must be true"),
        (
            "/score",
            {"queries": "q", "documents": "a", "truncate_prompt_tokens": 8},
            "invalid_request",
            "body.truncate_prompt_tokens is not supported (texts are never cut",
        ),
        (
            "/rerank",
            {"query": "q", "documents": ["a"], "instruction": "be strict"},
            "invalid_request",
            "body.instruction is not supported (score templates are not)",
        ),
        ("/classify", {"messages": [{"role": "user", "content": "x"}]}, "invalid_request", "body.messages is not"),
    ],
)
def test_bad_pooling_bodies_fail_alone_naming_the_field(url: str, body: dict[str, Any], code: str, message: str):
    error = failure(line(url, **body))
    assert error.code == code and error.message.startswith(message), error.message


def test_a_model_that_cannot_do_the_task_fails_the_line_saying_which_can():
    generator = failure(line("/score", model="SmolLM2", queries="q", documents="a"))
    assert generator.code == "model_mismatch"
    assert generator.message.startswith("body.model 'SmolLM2' is a text generator: it cannot score; ")
    assert generator.message.endswith("'all-MiniLM-L6-v2', 'ce' can (name it, or no model)")
    embedder = failure(line("/classify", model="all-MiniLM-L6-v2", input="x"))
    assert embedder.message == "body.model 'all-MiniLM-L6-v2' cannot classify; 'ce' can (name it, or no model)"
    unknown = failure(line("/rerank", model="other", query="q", documents=["a"]))
    assert unknown.code == "model_mismatch" and "body.model 'other' is not the served model" in unknown.message


def test_a_task_no_served_model_does_fails_as_an_invalid_url():
    error = failure(line("/classify", input="x"), encoder_tasks={"all-MiniLM-L6-v2": ("embed", "score", "rerank")})
    assert error.code == "invalid_url"
    assert error.message.startswith("no served model can classify: the encoder models here are 'all-MiniLM-L6-v2'")


def test_a_job_that_serves_no_encoder_refuses_pooling_urls():
    error = failure(line("/rerank", query="q", documents=["a"]), endpoints=("/v1/chat/completions",))
    assert error.code == "invalid_url" and error.message.endswith("got '/rerank'")


def test_every_pooling_line_validates_as_vllms_batch_input():
    run_batch = pytest.importorskip("vllm.entrypoints.launchers.run_batch", reason="needs vLLM")
    for text in (
        line("/v1/score", queries="q", documents=["a", "b"]),
        line("/rerank", query="q", documents=["a"], top_n=1),
        line("/v2/rerank", query="q", documents=["a"]),
    ):
        run_batch.BatchRequestInput.model_validate_json(text)
        parse(text)


def test_answers_are_vllms_score_rerank_and_classify_responses_in_its_batch_output_lines():
    run_batch = pytest.importorskip("vllm.entrypoints.launchers.run_batch", reason="needs vLLM")
    from vllm.entrypoints.pooling.classify.protocol import ClassificationResponse
    from vllm.entrypoints.pooling.scoring.protocol import RerankResponse, ScoreResponse

    score = parse(line("/score", queries="q", documents=["a", "b", "c"]))
    answered = embedding_response_line(score, [[0.2], [0.9], [0.5]], prompt_tokens=9, model="ce", request_number=3)
    body = ScoreResponse.model_validate(answered["response"]["body"])
    assert [item.score for item in body.data] == [0.2, 0.9, 0.5] and body.usage.prompt_tokens == 9
    assert run_batch.BatchRequestOutput.model_validate(answered).response.body == body

    rerank = parse(line("/rerank", query="q", documents=["a", "b", "c"], top_n=2))
    answered = embedding_response_line(rerank, [[0.2], [0.9], [0.5]], prompt_tokens=9, model="ce", request_number=4)
    ranked = RerankResponse.model_validate(answered["response"]["body"])
    assert [(result.index, result.document.text, result.relevance_score) for result in ranked.results] == [
        (1, "b", 0.9),
        (2, "c", 0.5),
    ]
    run_batch.BatchRequestOutput.model_validate(answered)

    classify = parse(line("/classify", input=["x", "y"]))
    outputs = [[0.1, 0.2, 0.7], [0.6, 0.3, 0.1]]
    answered = embedding_response_line(
        classify, outputs, prompt_tokens=4, model="ce", request_number=5, labels=["positive", "negative"]
    )
    classes = ClassificationResponse.model_validate(answered["response"]["body"])
    assert [(item.label, item.num_classes) for item in classes.data] == [("positive", 3), ("negative", 3)]


def test_an_answer_with_a_wrong_number_of_outputs_is_refused():
    score = parse(line("/score", queries="q", documents=["a", "b"]))
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        embedding_response_line(score, [[0.2]], prompt_tokens=1, model="ce", request_number=1)
