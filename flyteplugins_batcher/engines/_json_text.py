"""`parse_json_object`: a JSON object given as text (a schema, engine arguments), with one clear error."""

from __future__ import annotations

import json
from typing import Any

from flyteplugins_batcher.engines._engine_errors import shown


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    """The JSON object `text` holds.

    Args:
        text: JSON text.
        what: What the text is, for the error message (`"a JSON schema"`).

    Raises:
        ValueError: `text` is not JSON, or not a JSON object; the message names `what`.

    Example:
        ```python
        assert parse_json_object('{"max_model_len": 4096}', "engine arguments") == {"max_model_len": 4096}
        ```
    """
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} must be JSON text, got {shown(text)}: {error}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(parsed).__name__}: {shown(text)}")
    return parsed
