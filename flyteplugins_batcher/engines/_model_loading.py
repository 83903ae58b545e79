"""Model loads in a replica process: one at a time, and without progress bars.

Loading a Transformers model (an LLM, or the sentence-transformers embedding model) patches torch
globals while it runs (meta-device initialisation, `torch.linspace`, `torch.nn.init`) and restores
them afterwards. Two loads in threads at once can restore them in the wrong order and leave them
patched, and a later load then fails with "Cannot copy out of meta tensor". That happens when one
process serves both kinds of replica, as a `--local` run of a file that mixes chat and embedding
lines does; on a cluster each replica kind is a pod of its own and the lock is never contended.

Transformers' "Loading weights" bar is turned off: a run's terminal output is its progress line,
its summary and where its report is.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOADS = threading.Lock()


@contextmanager
def loading_model() -> Iterator[None]:
    """Hold this process's model-load lock, with Transformers' progress bars off.

    Example:
        ```python
        with loading_model():
            engine.load()
        ```
    """
    with _LOADS:
        try:
            from transformers.utils import logging as transformers_logging
        except ImportError:  # an engine without Transformers has no bar to turn off
            pass
        else:
            transformers_logging.disable_progress_bar()
        yield
