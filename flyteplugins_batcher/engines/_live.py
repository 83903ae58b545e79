"""What a record carries while it runs: a cancellation token its caller sets, and a listener for its text as it is made.

Both travel on a `Request` (and on to its `PreparedPrompt`), so that an engine learns of them
through the record itself and the batcher's core never knows about engines: the batcher calls a
running record's `cancel()` when its future is cancelled (`Request.cancel` sets the token).

- `CancellationToken`: set once, from any thread. An engine that can stop a running record checks
  it (Transformers, at each decoding step) or registers a callback (vLLM stream mode aborts the
  request; the simulated engine drops the sequence from its scheduler).
- `DeltaListener`: `listener(choice_index, text, logprobs)`, called by an engine with each new piece
  of a sample's text (and its tokens' `TokenLogprob`s, when the record asked for them) as it is
  made, from the engine's own thread (vLLM's engine loop, the simulated GPU thread); the listener
  hops onto its own event loop itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flyteplugins_batcher.engines._completion import TokenLogprob

logger = logging.getLogger("flyteplugins_batcher")

DeltaListener = Callable[[int, str, "tuple[TokenLogprob, ...]"], None]
"""Receives `(choice_index, new_text, new_logprobs)` from the engine's thread, in order per choice; must be quick
and thread-safe. `new_logprobs` is `()` unless the record asked for logprobs."""


class CancellationToken:
    """Says, once and from any thread, that a record's answer is no longer wanted.

    Callbacks run once, on the thread that cancels (at once, for one added after the fact); one
    that raises is logged and the others still run.

    Example:
        ```python
        token = CancellationToken()
        token.add_callback(lambda: print("stop generating"))
        request = Request("Write a long story.", cancellation=token)
        ...
        token.cancel()  # the client left: the engine stops the record at its next step
        assert token.cancelled
        ```
    """

    __slots__ = ("_callbacks", "_cancelled", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        """Whether `cancel()` was called."""
        return self._cancelled

    def cancel(self) -> None:
        """Cancel (idempotent): run the callbacks, once."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _run(callback)

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call `callback()` when the token is cancelled (now, if it already is)."""
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)
                return
        _run(callback)

    def __repr__(self) -> str:
        return f"CancellationToken(cancelled={self._cancelled})"


def _run(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:  # one engine's failure to stop must not keep the others from being told
        logger.exception("a cancellation callback raised")
