"""The held-out structured-output cases (tests/data/held_out_schemas.json) and how their answers are scored.

Each case is a prompt and a JSON schema (nested objects, enums, arrays, required fields, a pattern,
a nullable field). An answer that ended on its own (`finish_reason="stop"`) must parse as JSON and
validate against its schema; one cut off by `max_tokens` (`"length"`) is counted apart, never as a
success.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from flyteplugins_batcher.engines import Completion, GenerationConfig, Request, ResponseFormat

CASES_PATH = Path(__file__).resolve().parent.parent / "tests" / "data" / "held_out_schemas.json"
JSON_OBJECT_PROMPTS = ["Describe your favourite city as a JSON object.", "Give me a JSON object about a cat."]
STRUCTURED_MAX_TOKENS = 256
"""Enough for SmolLM2 to close every held-out schema's JSON when it does not loop."""


def held_out_cases() -> list[dict[str, Any]]:
    """The held-out cases: `name`, `prompt` and `schema` each."""
    return json.loads(CASES_PATH.read_text(encoding="utf-8"))


def held_out_requests(*, temperature: float = 0.0, n: int = 1, seed: int | None = None) -> list[Request]:
    """A chat request per held-out schema and per JSON-object prompt, each constrained by its format."""
    requests = []
    formats = [
        (case["prompt"], ResponseFormat.json_schema(case["schema"], name=case["name"])) for case in held_out_cases()
    ]
    formats += [(prompt, ResponseFormat.json_object()) for prompt in JSON_OBJECT_PROMPTS]
    for prompt, response_format in formats:
        generation = GenerationConfig(
            max_new_tokens=STRUCTURED_MAX_TOKENS,
            temperature=temperature,
            n=n,
            seed=seed,
            response_format=response_format,
        )
        requests.append(Request([{"role": "user", "content": prompt}], generation, id=response_format.describe()))
    return requests


def invalid_reason(text: str, response_format: ResponseFormat) -> str | None:
    """Why a finished answer does not satisfy its format, or None when it does."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return f"not JSON: {error}"
    if response_format.schema is None:
        return None if isinstance(value, dict) else f"not a JSON object: {text!r}"
    try:
        jsonschema.validate(value, json.loads(response_format.schema))
    except jsonschema.ValidationError as error:
        return f"does not follow the schema: {error.message}"
    return None


@dataclass
class Validity:
    """Answers scored against their formats: answered (stop), valid, cut off by length, and the failures."""

    answered: int = 0
    valid: int = 0
    cut_by_length: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, requests: Sequence[Request], outcomes: Sequence[Completion | Exception]) -> None:
        for request, outcome in zip(requests, outcomes, strict=True):
            assert isinstance(outcome, Completion), f"{request.id}: {outcome!r}"
            assert request.generation is not None and request.generation.response_format is not None
            for sample in outcome.samples:
                if sample.finish_reason == "length":
                    self.cut_by_length += 1
                    continue
                self.answered += 1
                reason = invalid_reason(sample.text, request.generation.response_format)
                if reason is None:
                    self.valid += 1
                else:
                    self.failures.append(f"{request.id}: {reason}: {sample.text!r}")

    def summary(self, engine: str) -> str:
        return (
            f"structured output, {engine}: {self.answered} answered, {self.valid} valid "
            f"({self.valid / max(self.answered, 1):.0%}), {self.cut_by_length} cut by length"
        )
