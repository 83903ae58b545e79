"""The remote engine: records answered by an OpenAI-compatible endpoint (`create_engine("openai", base_url=...)`).

Its folder is private: the engine is built by name (`create_engine`, `EngineSettings(engine="openai")`), so that
the package's public surface stays one a user can hold.
"""

from __future__ import annotations

from flyteplugins_batcher.engines._openai._engine import OpenAIEngine

__all__ = ["OpenAIEngine"]
