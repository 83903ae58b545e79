"""Reading the final number out of a gold solution or a model's completion, and comparing them."""

from __future__ import annotations

import math
import re

_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?"
_GOLD_MARKER = re.compile(r"####\s*(" + _NUMBER + ")")
_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:)?\s*[:=]?\s*\**\s*(" + _NUMBER + ")", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}")
_ANY_NUMBER = re.compile(_NUMBER)


def parse_number(text: str) -> float | None:
    """`"$1,234.50"` -> 1234.5; None when the text is not a number."""
    cleaned = text.replace(",", "").replace("$", "").rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def gold_answer(solution: str) -> float | None:
    """The number after `####` in a gsm8k solution, or None if it has none."""
    match = _GOLD_MARKER.search(solution)
    return parse_number(match.group(1)) if match else None


def extract_answer(completion: str) -> float | None:
    """The model's final numeric answer.

    Prefers an explicit marker (`The answer is N`, `\\boxed{N}`, `#### N`), taking the last one;
    otherwise falls back to the last number in the text.
    """
    for pattern in (_GOLD_MARKER, _BOXED, _ANSWER_PHRASE):
        matches = pattern.findall(completion)
        if matches:
            return parse_number(matches[-1])
    numbers = _ANY_NUMBER.findall(completion)
    return parse_number(numbers[-1]) if numbers else None


def is_correct(predicted: float | None, gold: float | None) -> bool:
    """Whether a predicted number matches the gold one (to 1e-6, so 2.25 == 2.250)."""
    return predicted is not None and gold is not None and math.isclose(predicted, gold, rel_tol=0, abs_tol=1e-6)
