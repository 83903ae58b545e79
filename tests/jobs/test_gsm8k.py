"""gsm8k loading and scoring: sources, bad rows, clamping, and reading numbers out of completions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flyteplugins_batcher.jobs._gsm8k import (
    SAMPLE_PATH,
    chat_prompt,
    extract_answer,
    gold_answer,
    is_correct,
    load_problems,
)
from flyteplugins_batcher.jobs._hub import hub_reachable

SHARED_GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k" / "test.jsonl"


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("3 + 4 = 7. The answer is 7.", 7.0),
        ("First 12, then 30.\nThe answer is: $1,250.", 1250.0),
        ("so the total is \\boxed{42}", 42.0),
        ("We get 5 then 9\n#### 14", 14.0),
        ("The answer is 2.25 pizzas.", 2.25),
        ("Loss of -3 degrees", -3.0),
        ("no digits here", None),
        ("steps: 10 apples, 4 eaten, 6 left", 6.0),
    ],
)
def test_extract_answer(completion: str, expected: float | None):
    assert extract_answer(completion) == expected


def test_gold_answer_and_correctness():
    assert gold_answer("Janet sells 9 eggs.\n#### 18") == 18.0
    assert gold_answer("no marker") is None
    assert is_correct(18.0, 18.0) and is_correct(2.25, 2.2500000001)
    assert not is_correct(None, 18.0) and not is_correct(18.0, None) and not is_correct(17.0, 18.0)


def test_bundled_sample_is_complete_and_scorable():
    loaded = load_problems("sample")
    assert loaded.source == "the bundled sample"
    assert len(loaded.problems) == 24 == loaded.available
    assert all(problem.gold is not None for problem in loaded.problems)
    rows = [json.loads(line) for line in SAMPLE_PATH.read_text().splitlines()]
    assert [gold_answer(row["answer"]) for row in rows] == [problem.gold for problem in loaded.problems]


def test_num_questions_larger_than_the_source_is_clamped(caplog):
    loaded = load_problems("sample", limit=1000)
    assert len(loaded.problems) == 24
    assert "using all of them" in caplog.text


def test_limit_must_be_positive():
    with pytest.raises(ValueError, match="num_questions must be >= 1"):
        load_problems("sample", limit=0)


def test_a_missing_path_is_a_clear_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="not 'auto', 'hub', 'sample' or an existing file"):
        load_problems(str(tmp_path / "nope.jsonl"))


def test_rows_without_a_question_are_skipped_and_reported(tmp_path: Path, caplog):
    path = tmp_path / "mixed.jsonl"
    rows = [
        {"question": "What is 1 + 1?", "answer": "#### 2"},
        {"answer": "#### 3"},
        {"question": "   ", "answer": "#### 4"},
        {"question": "What is 2 + 3?", "answer": "no gold line"},
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    loaded = load_problems(str(path))
    assert [problem.index for problem in loaded.problems] == [0, 3]
    assert [row for row, _ in loaded.skipped] == [1, 2]
    assert loaded.problems[1].gold is None  # kept, but not scorable
    assert "skipped 2 rows without a question" in caplog.text


def test_a_source_with_no_usable_rows_is_an_error(tmp_path: Path):
    path = tmp_path / "empty.jsonl"
    path.write_text(json.dumps({"text": "not gsm8k"}))
    with pytest.raises(ValueError, match="no usable gsm8k problems"):
        load_problems(str(path))


def test_parquet_sources_load(tmp_path: Path):
    import datasets

    path = tmp_path / "few.parquet"
    datasets.Dataset.from_list([{"question": "What is 6 * 7?", "answer": "#### 42"}]).to_parquet(str(path))
    loaded = load_problems(str(path))
    assert loaded.problems[0].gold == 42.0


@pytest.mark.skipif(not SHARED_GSM8K.exists(), reason="the shared gsm8k test split is not on this machine")
def test_the_real_gsm8k_test_split_loads_from_a_local_path():
    loaded = load_problems(str(SHARED_GSM8K), limit=32)
    assert loaded.available == 1319 and len(loaded.problems) == 32
    assert loaded.problems[0].gold == 18.0


def test_offline_mode_means_unreachable_without_waiting(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_reachable() is False
    loaded = load_problems("auto", limit=2)
    assert loaded.source == "the bundled sample"


def test_chat_prompt_has_the_instructions_and_the_question():
    messages = chat_prompt("What is 2 + 2?")
    assert messages[0]["role"] == "system" and "The answer is N" in messages[0]["content"]
    assert messages[1] == {"role": "user", "content": "What is 2 + 2?"}
