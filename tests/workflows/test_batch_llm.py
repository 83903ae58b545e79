"""The gsm8k workflow, end to end through flyte's local runner with the real SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import flyte.errors
import pytest

from flyteplugins_batcher import SharedBatcher
from workflows import batch_llm
from workflows.schema import RunResult

FAST = {"max_new_tokens": 24, "source": "sample"}


@pytest.mark.slow
def test_main_answers_scores_and_batches_across_concurrent_chunks(run_locally, fresh_shared_engine):
    result: RunResult = run_locally(batch_llm.main, num_questions=6, chunk_size=2, **FAST)

    assert result.source == "the bundled sample"
    assert result.questions == 6 and result.answered == 6 and result.failed_questions == []
    assert [answer.index for answer in result.answers] == list(range(6))
    assert all(answer.completion.strip() for answer in result.answers)
    assert result.scored == 6 and 0.0 <= result.accuracy <= 1.0
    assert result.accuracy == sum(answer.correct for answer in result.answers) / 6
    assert result.questions_per_s > 0 and result.tokens_per_s > 0

    (replica,) = result.replicas  # local mode: one process, one shared engine and batcher
    assert replica.records == 6
    # Three concurrent infer_batch calls of 2 prompts each fed one batcher: batches were shared.
    assert replica.avg_batch_size > 2
    assert 0.0 < replica.utilization <= 1.0
    assert fresh_shared_engine.loads == 1


@pytest.mark.slow
def test_a_failing_chunk_is_retried_then_reported_while_the_rest_is_kept(run_locally, monkeypatch, tmp_path: Path):
    attempts = {"poison": 0}

    def poisoned_batcher(engine, settings):
        batcher = batch_llm.make_batcher(engine, settings)
        generate = batcher._caller.fn

        def generate_or_fail(prompts):
            if any("POISON" in prompt for prompt in prompts):
                # on_error="split" bisects the batch until the poison runs alone: once per chunk attempt
                attempts["poison"] += len(prompts) == 1
                raise RuntimeError("the GPU fell off the bus")
            return generate(prompts)

        batcher._caller.fn = generate_or_fail
        return batcher

    monkeypatch.setattr(batch_llm, "LLM", SharedBatcher(batch_llm.load_engine, poisoned_batcher))
    questions = ["What is 2 + 2?", "What is 3 + 5?", "POISON: what is 1 + 1?", "What is 10 - 4?"]
    path = tmp_path / "questions.jsonl"
    path.write_text("\n".join(json.dumps({"question": q, "answer": f"#### {i}"}) for i, q in enumerate(questions)))

    result: RunResult = run_locally(batch_llm.main, source=str(path), chunk_size=2, max_new_tokens=16)

    assert attempts["poison"] == 1 + batch_llm.CHUNK_RETRIES  # Flyte retried the chunk
    assert result.failed_questions == [2, 3]  # the poisoned chunk, reported by dataset row
    assert result.answered == 2
    assert all(answer.completion for answer in result.answers[:2])
    assert "chunk failed" in result.answers[2].error


def test_chunk_size_must_be_positive(run_locally):
    with pytest.raises(flyte.errors.RuntimeUserError, match="chunk_size must be >= 1"):
        run_locally(batch_llm.main, chunk_size=0, source="sample")


def test_a_missing_source_path_is_a_clear_error(run_locally, tmp_path: Path):
    with pytest.raises(flyte.errors.RuntimeUserError, match="existing file"):
        run_locally(batch_llm.main, source=str(tmp_path / "missing.jsonl"))
