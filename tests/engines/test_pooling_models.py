"""`EmbeddingModel` as a cross-encoder and a classifier (tiny, random weights, made for the session) on Transformers:
the numbers sentence-transformers' `CrossEncoder` and Transformers' sequence classification give, and inputs longer
than the model failing alone. vLLM's engine against vLLM itself is `tests/jobs/test_pooling_vllm_parity.py`'s."""

from __future__ import annotations

import pytest

from flyteplugins_batcher.engines import ContextLengthExceededError, Embedding, EmbeddingModel, InvalidPromptError

QUERY = "what is the capital of france"
DOCUMENTS = ["paris is the capital of france", "the cat sat on the mat", "berlin is in germany", "rome"]


def test_a_model_says_what_it_does_from_its_config_alone(pooling_models: dict[str, str]):
    assert EmbeddingModel(pooling_models["cross_encoder"]).tasks == ("score", "rerank", "classify")
    assert EmbeddingModel(pooling_models["classifier"]).tasks == ("classify",)
    assert EmbeddingModel().tasks == ("embed", "score", "rerank")
    assert EmbeddingModel(pooling_models["classifier"]).name == "classifier"


def test_a_cross_encoders_scores_are_sentence_transformers_cross_encoders(pooling_models: dict[str, str]):
    sentence_transformers = pytest.importorskip("sentence_transformers", reason="needs the embed extra")
    reference = sentence_transformers.CrossEncoder(pooling_models["cross_encoder"], device="cpu")
    expected = reference.predict([(QUERY, document) for document in DOCUMENTS])
    model = EmbeddingModel(pooling_models["cross_encoder"], engine="transformers")
    outcomes = model.classify([(QUERY, document) for document in DOCUMENTS])
    scores = [model.activated(outcome.vector)[0] for outcome in outcomes if isinstance(outcome, Embedding)]
    assert scores == pytest.approx([float(value) for value in expected], abs=1e-5)
    assert max(scores) - min(scores) > 0.05  # the random weights tell pairs apart: a wrong pairing would show
    assert [outcome.tokens for outcome in outcomes] == [  # type: ignore[union-attr]
        len(reference.tokenizer(QUERY, document)["input_ids"]) for document in DOCUMENTS
    ]


def test_a_classifiers_probabilities_are_transformers_softmax_and_its_labels_are_named(pooling_models: dict[str, str]):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = pooling_models["classifier"]
    tokenizer, reference = AutoTokenizer.from_pretrained(path), AutoModelForSequenceClassification.from_pretrained(path)
    with torch.no_grad():
        expected = reference(**tokenizer(DOCUMENTS, padding=True, return_tensors="pt")).logits.softmax(-1).tolist()
    model = EmbeddingModel(path, engine="transformers")
    probabilities = [model.activated(outcome.vector) for outcome in model.classify(DOCUMENTS)]  # type: ignore[union-attr]
    for mine, theirs in zip(probabilities, expected, strict=True):
        assert mine == pytest.approx(theirs, abs=1e-5)
    assert model.labels == {0: "negative", 1: "neutral", 2: "positive"}


def test_a_pair_longer_than_the_model_fails_alone(pooling_models: dict[str, str]):
    model = EmbeddingModel(pooling_models["cross_encoder"], engine="transformers")
    outcomes = model.classify([(QUERY, DOCUMENTS[0]), (QUERY, "word " * 200), (QUERY, DOCUMENTS[1])])
    assert isinstance(outcomes[0], Embedding) and isinstance(outcomes[2], Embedding)
    assert isinstance(outcomes[1], ContextLengthExceededError)
    assert str(outcomes[1]) == "the pair has 209 tokens, but the model reads at most 128"
    assert model.max_length == 128


def test_an_embedder_cannot_classify_and_a_classifier_cannot_embed(pooling_models: dict[str, str]):
    [refused] = EmbeddingModel().classify(["x"])
    assert (
        isinstance(refused, InvalidPromptError)
        and str(refused) == "all-MiniLM-L6-v2 is an embedding model: it cannot classify"
    )
    [refused] = EmbeddingModel(pooling_models["classifier"], engine="transformers").encode(["x"])
    assert isinstance(refused, InvalidPromptError) and str(refused) == "classifier is a classifier: it cannot embed"


def test_the_simulated_engine_cannot_run_a_classifier(pooling_models: dict[str, str]):
    from flyteplugins_batcher.engines import EngineConfigError

    with pytest.raises(EngineConfigError, match="the 'simulated' engine cannot run a classifier"):
        EmbeddingModel(pooling_models["classifier"], engine="simulated").tasks  # noqa: B018
