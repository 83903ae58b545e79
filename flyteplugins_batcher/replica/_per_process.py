"""`PerProcess`: the one object of a kind in a process, made on first use, that its owner can install."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """Holds a process's one replica of a kind: made with `make` on first use, or the one installed.

    Args:
        make: Makes the default one.
    """

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value: T | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        """The one held, made now if there is none."""
        with self._lock:
            if self._value is None:
                self._value = self._make()
            return self._value

    def install(self, value: T) -> None:
        """Hold `value` from now on, in place of the one held (which is left as it is)."""
        with self._lock:
            self._value = value

    def release(self, value: T) -> None:
        """Let `value` go, if it is the one held: the next `get` makes a fresh one."""
        with self._lock:
            if self._value is value:
                self._value = None
