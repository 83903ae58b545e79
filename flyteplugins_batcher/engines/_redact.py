"""Secrets kept out of what the package prints: an error's text with every credential it may hold masked."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

_SECRET_NAME = re.compile(r"(SECRET|TOKEN|PASSWORD|API_KEY|ACCESS_KEY|SESSION|CREDENTIAL)", re.IGNORECASE)
"""Environment variables whose values are credentials (AWS_SECRET_ACCESS_KEY, OPENAI_API_KEY, HF_TOKEN, ...)."""

_SHORTEST_SECRET = 6
"""Values shorter than this are not masked: they would mask ordinary words (and no real credential is so short)."""

_SIGNATURES = re.compile(r"(Credential=|Signature=|X-Amz-Signature=|Bearer\s+|sig=|key=)[^\s&,\"'<]+", re.IGNORECASE)
"""A credential written into a request's line or headers, as an error may quote it."""

MASK = "***"


def redact(text: str, *secrets: str | None) -> str:
    """`text` with every credential masked: `secrets`, each credential in the environment, signed request parts.

    Example:
        ```python
        os.environ["OPENAI_API_KEY"] = "sk-live-123456"
        assert redact("refused sk-live-123456") == "refused ***"
        ```
    """
    for secret in sorted(_known_secrets(secrets), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _SIGNATURES.sub(lambda match: match.group(1) + MASK, text)


def _known_secrets(given: Iterable[str | None]) -> set[str]:
    values = {value for value in given if value}
    values.update(value for name, value in os.environ.items() if _SECRET_NAME.search(name))
    return {value for value in values if len(value) >= _SHORTEST_SECRET}
