"""`benchmarks/bench_compact_json.py` compares two runs' answers as JSON values, whatever their whitespace, and weighs
each run's answers against the same values written compact."""

from __future__ import annotations

from typing import Any

from benchmarks.bench_compact_json import overhead, same_json_tokens


def run(answers: list[Any], tokens: list[int]) -> dict[str, Any]:
    return {"answers": answers, "tokens": tokens}


def test_answers_are_the_same_json_whatever_their_whitespace_or_form() -> None:
    before = run(['{"a": 1, "b": [2, 3]}', '{"a": 2}', None, "not json"], [14, 7, 160, 9])
    after = run(['{"a":1,"b":[2,3]}', {"a": 3}, None, "not json"], [9, 5, 160, 9])
    assert same_json_tokens(before, after) == [(14, 9)]  # parsed values equal; no answer and unparsable never match


def test_overhead_is_the_tokens_taken_per_token_of_the_same_values_written_compact() -> None:
    class CharTokenizer:
        """One token per character, so that the compact text's tokens are its length."""

        def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
            return {"input_ids": list(range(len(text)))}

    compact = '{"a":1}'  # 7 tokens, and the end-of-text token: 8
    count, ratio = overhead(run(['{ "a" : 1 }', None], [12, 160]), CharTokenizer())
    assert (count, ratio) == (1, 12 / (len(compact) + 1))
