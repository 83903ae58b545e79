"""A module-level `@batched` or `SharedBatcher` pickles as its settings: `flyte deploy` and remote runs pickle tasks."""

from __future__ import annotations

import pickle

import cloudpickle

from flyteplugins_batcher import SharedBatcher, TokenBatcher, batched


def upper(texts: list[str]) -> list[str]:
    return [text.upper() for text in texts]


async def test_a_started_batched_function_pickles_as_its_function_and_settings_and_the_copy_works():
    shout = batched(upper, max_batch_size=8, batch_timeout_s=0.01)
    assert await shout("hi") == "HI"  # started: its batcher holds threads, locks and an event loop
    copy = pickle.loads(cloudpickle.dumps(shout))
    assert copy.batcher is None  # the copy starts a batcher of its own, on first use
    assert copy.options == shout.options
    assert await copy.run(["a", "b"]) == ["A", "B"]
    assert copy.batcher is not shout.batcher
    await shout.aclose()
    await copy.aclose()


async def test_a_token_batched_function_keeps_its_class_and_budget_when_pickled():
    shout = batched(upper, batcher_class=TokenBatcher, target_batch_tokens=123, token_estimator=len)
    copy = pickle.loads(cloudpickle.dumps(shout))
    assert await copy("x") == "X"
    assert isinstance(copy.batcher, TokenBatcher)
    assert copy.batcher.settings.target_batch_cost == 123
    await copy.aclose()


async def test_a_shared_batcher_with_a_loaded_model_pickles_without_it():
    from flyteplugins_batcher import DynamicBatcher

    loads: list[str] = []

    def load(key: str):
        loads.append(key)
        return upper

    shared = SharedBatcher(load, lambda model, _key: DynamicBatcher(model, batch_timeout_s=0.01), name="shouter")
    assert await (await shared.get("k")).run(["a"]) == ["A"]
    copy = pickle.loads(cloudpickle.dumps(shared))
    assert (copy.name, copy.loaded_model, copy.batcher, copy.loads) == ("shouter", None, None, 0)
    assert await (await copy.get("k")).run(["b"]) == ["B"]
    assert (shared.loads, copy.loads) == (1, 1)  # the copy loaded a model of its own
    await shared.aclose()
    await copy.aclose()
