"""The batcher runs wherever asyncio does: importing it loads neither Flyte nor async_lru until a Flyte helper runs."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import flyteplugins_batcher as batcher

loaded = lambda: {name: name in sys.modules for name in ("flyte", "async_lru")}
seen = {"import": loaded()}
batcher.DynamicBatcher, batcher.TokenBatcher, batcher.BatcherSettings, batcher.size_in_flight
seen["the batcher"] = loaded()
batcher.batched
seen["batched"] = loaded()
batcher.inference_environment
seen["inference_environment"] = loaded()
print(json.dumps(seen))
"""


def test_flyte_and_async_lru_load_only_when_a_flyte_helper_is_used() -> None:
    seen = json.loads(subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout)
    assert seen == {
        "import": {"flyte": False, "async_lru": False},
        "the batcher": {"flyte": False, "async_lru": False},
        "batched": {"flyte": False, "async_lru": True},
        "inference_environment": {"flyte": True, "async_lru": True},
    }


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    import pytest

    import flyteplugins_batcher

    with pytest.raises(AttributeError, match="no attribute 'Batchr'"):
        flyteplugins_batcher.Batchr  # noqa: B018
