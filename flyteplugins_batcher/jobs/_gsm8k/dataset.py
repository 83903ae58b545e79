"""gsm8k problems loaded (from the Hugging Face Hub, a local jsonl/parquet file, or our sample), and their prompt."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flyteplugins_batcher.jobs._gsm8k.scoring import gold_answer
from flyteplugins_batcher.jobs._hub import hub_reachable

logger = logging.getLogger("flyteplugins_batcher.jobs._gsm8k")

HUB_DATASET = ("openai/gsm8k", "main", "test")
SAMPLE_PATH = Path(__file__).resolve().parent.parent / "data" / "gsm8k_sample.jsonl"
SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the problem step by step with short sentences, "
    "then finish with a final line of the form 'The answer is N.' where N is a number."
)


def chat_prompt(question: str) -> list[dict[str, str]]:
    """Chat messages for one problem (engines render them with the model's chat template)."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


@dataclass(frozen=True)
class Problem:
    """One gsm8k problem.

    Attributes:
        index: Position in the source (row number, from 0).
        question: The problem text.
        gold: The gold final answer, or None when the row has no parsable `#### N` line.
    """

    index: int
    question: str
    gold: float | None


@dataclass
class LoadedProblems:
    """What `load_problems` found.

    Attributes:
        problems: The usable problems, in source order.
        source: Where they came from, in words (say it loudly: results depend on it).
        skipped: `(row, reason)` for rows that could not be used (no question).
        available: Usable rows in the source before `limit` was applied.
    """

    problems: list[Problem]
    source: str
    skipped: list[tuple[int, str]] = field(default_factory=list)
    available: int = 0


def load_problems(source: str = "auto", limit: int | None = None) -> LoadedProblems:
    """Load gsm8k problems with the `datasets` library.

    Args:
        source: `"hub"` (openai/gsm8k, config main, split test), `"sample"` (the problems bundled
            with this package, written by its authors), a path to a `.jsonl`/`.json`/`.parquet`
            file with `question` and `answer` columns, or `"auto"`: the Hub when it is reachable,
            else the sample.
        limit: Keep the first `limit` usable problems. More than the source has is clamped to
            what it has (logged as a warning), never an error.

    Returns:
        The problems, and which source was used.

    Raises:
        FileNotFoundError: `source` is a path that does not exist.
        ValueError: `limit` < 1, or the source has no usable problem.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"num_questions must be >= 1, got {limit}")
    if source == "auto":
        source = "hub" if hub_reachable() else "sample"
        if source == "sample":
            logger.warning("The Hugging Face Hub is not reachable: using the bundled sample of gsm8k-style problems")
    rows, description = _read_rows(source)
    loaded = _to_problems(rows, description)
    loaded.available = len(loaded.problems)
    if limit is not None:
        if limit > loaded.available:
            logger.warning(
                "num_questions=%d but %s has %d usable problems: using all of them",
                limit,
                description,
                loaded.available,
            )
        loaded.problems = loaded.problems[:limit]
    return loaded


def _read_rows(source: str) -> tuple[list[dict[str, Any]], str]:
    import datasets  # the `data` extra; imported late so the package imports without it

    datasets.disable_progress_bars()
    load_dataset = datasets.load_dataset

    if source == "hub":
        name, config, split = HUB_DATASET
        return list(load_dataset(name, config, split=split)), f"the Hugging Face Hub ({name}, {config}, {split})"
    path = SAMPLE_PATH if source == "sample" else Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"gsm8k source {source!r} is not 'auto', 'hub', 'sample' or an existing file (looked for {path})"
        )
    kind = "parquet" if path.suffix == ".parquet" else "json"
    description = "the bundled sample" if source == "sample" else f"local file {path}"
    return list(load_dataset(kind, data_files=str(path), split="train")), description


def _to_problems(rows: list[dict[str, Any]], description: str) -> LoadedProblems:
    loaded = LoadedProblems(problems=[], source=description)
    for index, row in enumerate(rows):
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            loaded.skipped.append((index, f"row {index} has no question: {str(row)[:80]}"))
            continue
        answer = row.get("answer")
        loaded.problems.append(
            Problem(index, question.strip(), gold_answer(answer) if isinstance(answer, str) else None)
        )
    if loaded.skipped:
        logger.warning(
            "%s: skipped %d rows without a question (first: %s)", description, len(loaded.skipped), loaded.skipped[0][1]
        )
    if not loaded.problems:
        raise ValueError(f"{description} has no usable gsm8k problems (rows need a 'question' field)")
    return loaded
