"""Old spellings that still work: each warns once per process, at the user's line, then keeps quiet."""

from __future__ import annotations

import os
import sys
import threading
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_warned: set[str] = set()
_lock = threading.Lock()


def warn_deprecated(old: str, new: str) -> None:
    """Say once per process that `old` is deprecated in favour of `new` (a `DeprecationWarning`).

    The warning points at the first caller outside this package, wherever inside it the old
    spelling was noticed.
    """
    with _lock:
        if old in _warned:
            return
        _warned.add(old)
    warnings.warn(
        f"{old!r} is deprecated and will be removed in a future release; use {new!r}",
        DeprecationWarning,
        stacklevel=_outside_caller_level(),
    )


def _outside_caller_level() -> int:
    """The `stacklevel`, as counted from `warn_deprecated`, of the first frame outside this package."""
    frame = sys._getframe(2)  # warn_deprecated's caller
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level
