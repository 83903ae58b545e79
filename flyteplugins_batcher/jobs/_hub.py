"""The Hugging Face Hub, where the jobs load datasets from (gsm8k's, a table named by its Hub name).

`datasets` retries an unreachable Hub for half a minute before it fails: the jobs ask first.
"""

from __future__ import annotations

import os
import socket

_HUB_HOST = ("huggingface.co", 443)
_OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def datasets_offline() -> bool:
    """Whether `HF_HUB_OFFLINE` or `HF_DATASETS_OFFLINE` is set: datasets load from the local cache only."""
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in _OFFLINE)


def hub_reachable(timeout_s: float = 2.0) -> bool:
    """Whether huggingface.co answers within `timeout_s` (False at once when offline: `datasets_offline`)."""
    if datasets_offline():
        return False
    try:
        with socket.create_connection(_HUB_HOST, timeout=timeout_s):
            return True
    except OSError:
        return False
