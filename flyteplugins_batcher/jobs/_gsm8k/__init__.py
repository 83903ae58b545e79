"""gsm8k for the example workflow: loading problems, prompting, and scoring numeric answers.

Example:
    ```python
    from flyteplugins_batcher.jobs._gsm8k import chat_prompt, extract_answer, is_correct, load_problems

    loaded = load_problems("sample", limit=8)
    prompts = [chat_prompt(problem.question) for problem in loaded.problems]
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.jobs._gsm8k.dataset import (
    SAMPLE_PATH,
    SYSTEM_PROMPT,
    LoadedProblems,
    Problem,
    chat_prompt,
    load_problems,
)
from flyteplugins_batcher.jobs._gsm8k.scoring import extract_answer, gold_answer, is_correct, parse_number

__all__ = [
    "SAMPLE_PATH",
    "SYSTEM_PROMPT",
    "LoadedProblems",
    "Problem",
    "chat_prompt",
    "extract_answer",
    "gold_answer",
    "is_correct",
    "load_problems",
    "parse_number",
]
