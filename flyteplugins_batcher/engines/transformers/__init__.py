"""The Transformers engine: padded batches through `model.generate` on one model thread.

Importing this package does not import torch or Transformers: the engine imports them when it loads.

Example:
    ```python
    from flyteplugins_batcher.engines.transformers import TransformersEngine

    engine = TransformersEngine()  # the bundled SmolLM2 on CPU
    engine.load()
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.engines.transformers._engine import TransformersEngine

__all__ = ["TransformersEngine"]
