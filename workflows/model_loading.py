"""One model load at a time in a process.

Loading a Transformers model (an LLM, or the sentence-transformers embedding model) patches torch
globals while it runs (meta-device initialisation, `torch.linspace`, `torch.nn.init`) and restores
them afterwards. Two loads in threads at once can restore them in the wrong order and leave them
patched, and a later load then fails with "Cannot copy out of meta tensor". That happens when one
process serves both kinds of replica, as a `--local` run of a file that mixes chat and embedding
lines does; on a cluster each replica kind is a pod of its own and the lock is never contended.
"""

from __future__ import annotations

import threading

MODEL_LOADS = threading.Lock()
"""Held while a model loads in this process."""
