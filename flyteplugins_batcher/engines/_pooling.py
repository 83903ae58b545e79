"""Sequence classifiers and cross-encoders: a model that reads a text (or a query and a document together) and
answers a score per class, on Transformers or on vLLM's pooling runner.

`EmbeddingModel` holds one of these when its reference is a sequence classifier (its `config.json`
names a `...ForSequenceClassification` architecture): a cross-encoder (one label) scores pairs, any
classifier classifies texts. Both engines answer the same numbers (to float error): the model's raw
logits, then its activation, resolved from its config as vLLM resolves it (`activation`):
`problem_type` `regression` none, `multi_label_classification` a sigmoid, a sentence-transformers
cross-encoder's `activation_fn`, else a sigmoid for one label and a softmax for several.

Inputs are never cut: an input (a pair's tokens together, the special tokens included) longer than
the model reads (`max_length`: its position embeddings, or its tokenizer's limit if less, as vLLM's
`max_model_len`) fails alone with `ContextLengthExceededError`.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flyteplugins_batcher.engines._engine_errors import ContextLengthExceededError, EngineConfigError
from flyteplugins_batcher.engines._model_loading import loading_model
from flyteplugins_batcher.engines._onednn import encoder_on_cpu

PoolingInput = str | tuple[str, str]
"""What a classifier reads: a text, or a (query, document) pair read together (a cross-encoder's)."""

_LARGE_TOKENIZER_LIMIT = 10**6
"""Tokenizers that do not know their model's limit say a huge number (`int(1e30)`): not a limit."""


def classifier_config(reference: str) -> dict[str, Any] | None:
    """The model's `config.json` when it is a sequence classifier, else None (an embedder, a generator, no config).

    Reads that one file (a local folder's, or the hub's cached or fetched one), never the weights, and
    needs no Transformers: a driver that routes lines on it may not have it.
    """
    config = _read_config(reference)
    architectures = config.get("architectures") or [] if config is not None else []
    if config is None or not any(str(name).endswith("ForSequenceClassification") for name in architectures):
        return None
    labels = config.get("id2label") or {}
    config["num_labels"] = len(labels) if labels else int(config.get("num_labels", 2))
    return config


def _read_config(reference: str) -> dict[str, Any] | None:
    path = Path(reference).expanduser()
    if path.is_dir():
        found: Path | None = path / "config.json"
    elif path.exists():
        return None  # a single file (GGUF): no config to read
    else:
        try:
            from huggingface_hub import hf_hub_download

            found = Path(hf_hub_download(reference, "config.json"))
        except Exception:  # no hub package, offline and not cached, not a repository: not a classifier we can see
            return None
    try:
        config = json.loads(found.read_text()) if found is not None and found.is_file() else None
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def classifier_tasks(config: Mapping[str, Any]) -> tuple[str, ...]:
    """What a classifier can do: a cross-encoder (one label) scores and reranks pairs too."""
    return ("score", "rerank", "classify") if config.get("num_labels") == 1 else ("classify",)


def activation(config: Mapping[str, Any]) -> Callable[[Sequence[float]], list[float]]:
    """The function vLLM applies to a classifier's logits (see the module notes)."""
    problem = config.get("problem_type") or ""
    named = (config.get("sentence_transformers") or {}).get("activation_fn") or config.get(
        "sbert_ce_default_activation_function"
    )
    if problem == "regression" or (not problem and named and str(named).endswith("Identity")):
        return lambda logits: [float(value) for value in logits]
    if problem == "multi_label_classification" or int(config.get("num_labels", 0)) < 2:
        return lambda logits: [1.0 / (1.0 + math.exp(-value)) for value in logits]
    return _softmax


def _softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    exponents = [math.exp(value - top) for value in logits]
    total = sum(exponents)
    return [value / total for value in exponents]


class Classifier:
    """A sequence classifier loaded on one engine: raw logits for texts and pairs, their token counts, the limit.

    Args:
        reference: Hub id or local path of the classifier.
        config: Its `config.json` (`classifier_config`).
        engine: `"transformers"` or `"vllm"` (`"auto"`: vLLM where CUDA is, else Transformers).
        engine_args: vLLM's engine arguments (`max_model_len`, `dtype`, ...), with `engine="vllm"`.
    """

    def __init__(
        self,
        reference: str,
        config: Mapping[str, Any],
        *,
        engine: str = "auto",
        engine_args: Mapping[str, Any] | None = None,
    ) -> None:
        if engine not in ("auto", "transformers", "vllm"):
            raise EngineConfigError(
                f"the {engine!r} engine cannot run a classifier or cross-encoder ({reference}): "
                "use transformers or vllm"
            )
        self.reference = reference
        self.config = config
        self.engine = engine
        self.engine_args = dict(engine_args or {})
        self.activate = activation(config)
        self.labels: dict[int, str] = {int(key): str(value) for key, value in (config.get("id2label") or {}).items()}
        self._lock = threading.Lock()  # one model call at a time (vLLM's offline LLM is not thread-safe)
        self._tokenizer: Any = None
        self._counter: Callable[[PoolingInput], int] | None = None
        self._run: Callable[[list[PoolingInput]], list[list[float]]] | None = None
        self._close: Callable[[], None] = lambda: None
        self.max_length = 0

    def load(self) -> None:
        """Load the tokenizer and the model on its engine (once)."""
        if self._run is not None:
            return
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(self.reference)
        self.max_length = _max_length(self.config, self._tokenizer)
        self._counter = _pair_counter(self._tokenizer)
        engine = self.engine
        if engine == "auto":
            import torch

            engine = "vllm" if torch.cuda.is_available() else "transformers"
        self._run, self._close = (_vllm if engine == "vllm" else _transformers)(self)

    def token_count(self, item: PoolingInput) -> int:
        """The tokens the model reads for a text or a pair (special tokens included); never cut."""
        self.load()
        assert self._counter is not None
        return self._counter(item)

    def logits(self, items: list[PoolingInput], counts: list[int]) -> list[list[float] | Exception]:
        """Each input's raw logits, in one model call; one longer than the model (its `counts`, from
        `token_count`) gets its error in its place."""
        self.load()
        assert self._run is not None
        valid = [index for index, count in enumerate(counts) if count <= self.max_length]
        results: list[list[float] | Exception] = [
            ContextLengthExceededError(
                f"{'the pair' if isinstance(item, tuple) else 'the text'} has {count} tokens, but the model reads "
                f"at most {self.max_length}"
            )
            for item, count in zip(items, counts, strict=True)
        ]
        if valid:
            with self._lock:
                outputs = self._run([items[index] for index in valid])
            for index, output in zip(valid, outputs, strict=True):
                results[index] = output
        return results

    def close(self) -> None:
        """Free the model (a vLLM engine's process stops); `load` loads it again."""
        with self._lock:
            close, self._close, self._run = self._close, (lambda: None), None
        close()


def _max_length(config: Mapping[str, Any], tokenizer: Any) -> int:
    """The longest input the model reads: its position embeddings (RoBERTa's two reserved ones aside), or its
    tokenizer's limit if less."""
    positions = int(config.get("max_position_embeddings") or 0)
    if config.get("model_type", "") in ("roberta", "xlm-roberta", "camembert") and positions > 2:
        positions -= 2
    limit = int(getattr(tokenizer, "model_max_length", 0) or 0)
    candidates = [value for value in (positions, limit) if 0 < value < _LARGE_TOKENIZER_LIMIT]
    return min(candidates) if candidates else 512


def _pair_counter(tokenizer: Any) -> Callable[[PoolingInput], int]:
    """Counts an input's tokens off a tokenizer backend of its own (see `_embeddings._length_counter` for why)."""
    if not getattr(tokenizer, "is_fast", False):
        lock = threading.Lock()

        def slow(item: PoolingInput) -> int:
            with lock:
                encoded = tokenizer(*item) if isinstance(item, tuple) else tokenizer(item)
            return len(encoded["input_ids"])

        return slow
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    own.no_padding()
    own.no_truncation()
    return lambda item: len(own.encode(*item).ids if isinstance(item, tuple) else own.encode(item).ids)


def _transformers(
    classifier: Classifier,
) -> tuple[Callable[[list[PoolingInput]], list[list[float]]], Callable[[], None]]:
    """Transformers' sequence classification (what sentence-transformers' `CrossEncoder` runs): padded batches."""
    import torch
    from transformers import AutoModelForSequenceClassification

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with loading_model():
        model = AutoModelForSequenceClassification.from_pretrained(classifier.reference).to(device).eval()
    if device == "cpu":
        encoder_on_cpu(torch, model)
    tokenizer = classifier._tokenizer

    def run(items: list[PoolingInput]) -> list[list[float]]:
        firsts = [item[0] if isinstance(item, tuple) else item for item in items]
        seconds = [item[1] for item in items if isinstance(item, tuple)]
        if seconds and len(seconds) != len(items):  # texts and pairs in one batch: each kind its own pass
            texts = [index for index, item in enumerate(items) if not isinstance(item, tuple)]
            pairs = [index for index, item in enumerate(items) if isinstance(item, tuple)]
            out = dict(zip(texts, run([items[i] for i in texts]), strict=True))
            out |= dict(zip(pairs, run([items[i] for i in pairs]), strict=True))
            return [out[index] for index in range(len(items))]
        encoded = tokenizer(firsts, seconds or None, padding=True, return_tensors="pt").to(device)
        with torch.inference_mode():
            return model(**encoded).logits.float().cpu().tolist()

    return run, lambda: None


def _vllm(classifier: Classifier) -> tuple[Callable[[list[PoolingInput]], list[list[float]]], Callable[[], None]]:
    """vLLM's pooling runner (`LLM(runner="pooling")`): `LLM.classify` for texts, `LLM.score` for pairs, raw logits."""
    from flyteplugins_batcher.engines.vllm._args import running_on_cpu, with_device_defaults
    from flyteplugins_batcher.engines.vllm._engine import config_errors, import_vllm, shutdown_offline

    vllm = import_vllm()
    args = with_device_defaults(classifier.engine_args, on_cpu=running_on_cpu())
    args.setdefault("max_model_len", classifier.max_length)
    with config_errors(classifier.reference), loading_model():
        llm = vllm.LLM(classifier.reference, runner="pooling", **args)
    raw = vllm.PoolingParams(use_activation=False)

    def run(items: list[PoolingInput]) -> list[list[float]]:
        texts = [index for index, item in enumerate(items) if not isinstance(item, tuple)]
        pairs = [index for index, item in enumerate(items) if isinstance(item, tuple)]
        out: dict[int, list[float]] = {}
        if texts:
            answers = llm.classify([items[i] for i in texts], pooling_params=raw, use_tqdm=False)
            out |= {index: list(answer.outputs.probs) for index, answer in zip(texts, answers, strict=True)}
        if pairs:
            queries = [items[i][0] for i in pairs]  # type: ignore[index]
            documents = [items[i][1] for i in pairs]  # type: ignore[index]
            answers = llm.score(queries, documents, pooling_params=raw, use_tqdm=False)
            out |= {index: [float(answer.outputs.score)] for index, answer in zip(pairs, answers, strict=True)}
        return [out[index] for index in range(len(items))]

    return run, lambda: shutdown_offline(llm)
