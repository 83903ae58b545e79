"""The GPU-timed simulated engine: vLLM's scheduling over a roofline model of a GPU, for runs without one.

Example:
    ```python
    from flyteplugins_batcher.engines.simulated import SimulatedEngine, SimulatedGpu

    engine = SimulatedEngine(gpu=SimulatedGpu(), time_scale=0.1)  # an H100 serving an 8B model, 10x faster
    engine.load()
    ```
"""

from __future__ import annotations

from flyteplugins_batcher.engines.simulated._engine import SimulatedEngine
from flyteplugins_batcher.engines.simulated._gpu import OutputLengths, SimulatedGpu

__all__ = [
    "OutputLengths",
    "SimulatedEngine",
    "SimulatedGpu",
]
