"""A user's own `preprocess` and `postprocess`, as the table job imports them: "tests.jobs.table_hooks:ask"."""

from __future__ import annotations

from typing import Any


def ask(row: dict[str, Any]) -> dict[str, Any]:
    """A row's request: its question, with settings of its own where the row says so (Ray's `sampling_params`)."""
    if row["question"] == "boom":
        raise KeyError("no such thing")
    request: dict[str, Any] = {"messages": [{"role": "user", "content": f"Q: {row['question']}"}]}
    if row["budget"] is not None:
        request["sampling_params"] = {"max_tokens": row["budget"]}
    if row["question"] == "too hot":
        request["temperature"] = 5
    return request


def words(row: dict[str, Any]) -> dict[str, Any]:
    """Columns to add, from a row and its answer: Ray's `dict(..., **row)` keeps the row's own columns as they are."""
    if row["question"] == "refuse":
        raise ValueError("cannot count these")
    return {
        **row,
        "question": "changed",
        "words": len(row["generated_text"].split()),
        "tokens": row["num_generated_tokens"],
    }


def late_column(row: dict[str, Any]) -> dict[str, Any]:
    """A column that only rows from the fourth on get: the first chunk's part has no `late` column."""
    return {**row, "late": row["n"] * 10} if row["n"] >= 3 else row
