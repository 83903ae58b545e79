"""The prompt we send for a gsm8k problem."""

from __future__ import annotations

SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the problem step by step with short sentences, "
    "then finish with a final line of the form 'The answer is N.' where N is a number."
)


def chat_prompt(question: str) -> list[dict[str, str]]:
    """Chat messages for one problem (engines render them with the model's chat template)."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
