"""vLLM's prefix cache seen through the engines: `Completion.cached_tokens` is vLLM's own `num_cached_tokens`.

Real vLLM (its CPU build) with the bundled SmolLM2 and prefix caching on (vLLM's default). Each
test uses documents of its own, so that nothing an earlier test computed is in the cache. The
numbers of the same-step case are printed (`pytest -s`) as well as checked.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs vLLM: `make install` adds its CPU build")

from flyteplugins_batcher.engines import Completion, GenerationConfig, create_engine
from tests.engines.test_vllm_engine import vllm_counter

pytestmark = pytest.mark.slow

FACTS = 32
"""Facts in a document: about 680 SmolLM2 tokens, over the 600 a long shared prefix should have."""


@pytest.fixture(scope="module", params=["batch", "stream"])
def engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A loaded vLLM engine for the mode, short answers, room for eight long prompts at once."""
    loaded = create_engine(
        "vllm",
        mode=request.param,
        generation=GenerationConfig(max_new_tokens=4),
        max_num_seqs=16,
        max_model_len=2048,
        kv_cache_memory_bytes=1 << 30,
    )
    loaded.load()
    yield loaded
    loaded.close()


def document(tag: str) -> str:
    """A long text that starts with `tag`, so that no two tags share a cached block."""
    facts = " ".join(f"Fact {n} of {tag}: the value of item {n} is {n * 7 % 97}." for n in range(FACTS))
    return f"Reference document {tag}.\n{facts}\n"


async def answers(engine: Any, prompts: list[str]) -> list[Completion]:
    """The prompts' completions, submitted together (one `generate` call)."""
    result = engine.generate(prompts)
    outcomes = await result if inspect.isawaitable(result) else result
    assert all(isinstance(outcome, Completion) for outcome in outcomes), outcomes
    return list(outcomes)


def shared_tokens(engine: Any, first: str, second: str) -> int:
    """How many leading prompt tokens two prompts share, as the model sees them."""
    shared = 0
    for a, b in zip(engine.prompt_ids(first), engine.prompt_ids(second), strict=False):
        if a != b:
            break
        shared += 1
    return shared


async def test_a_prefix_computed_by_an_earlier_request_is_cached_and_distinct_prompts_are_not(engine: Any) -> None:
    tag = f"repeat-{engine.mode}"
    first, second = (document(tag) + question for question in ("What is item 3?", "What is item 5?"))
    shared = shared_tokens(engine, first, second)
    assert shared >= 600
    cached_before, stats_before = vllm_counter("vllm:prompt_tokens_cached"), engine.stats

    [computed] = await answers(engine, [first])
    [reused] = await answers(engine, [second])
    distinct = await answers(engine, [document(f"{tag}-{n}") + "What is item 3?" for n in range(2)])

    assert computed.cached_tokens == 0 and [one.cached_tokens for one in distinct] == [0, 0]
    assert shared // 2 < reused.cached_tokens <= shared < reused.prompt_tokens  # whole cache blocks of the prefix
    counted = reused.cached_tokens
    assert vllm_counter("vllm:prompt_tokens_cached") - cached_before == counted  # vLLM's own count
    window = engine.stats.since(stats_before)
    assert (window.cached_tokens, window.prompt_tokens) == (
        counted,
        sum(one.prompt_tokens for one in [computed, reused, *distinct]),
    )


class PrefixCacheSteps:
    """vLLM's prefix-cache statistics of each engine step that looked a request up: (requests, tokens, tokens hit).

    A stat logger joined to the engine's own list, as the engines join their step recorder
    (`engines/vllm/_steps.py`): vLLM hands it the scheduler's statistics once per step.
    """

    def __init__(self, engine: Any) -> None:
        from vllm.v1.metrics.loggers import StatLoggerBase

        steps: list[tuple[int, int, int]] = []

        class Recorder(StatLoggerBase):
            def __init__(self) -> None:  # vLLM's own take its configuration; this one needs none
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kwargs: Any) -> None:
                cache = getattr(scheduler_stats, "prefix_cache_stats", None)
                if cache is not None and cache.requests:
                    steps.append((cache.requests, cache.queries, cache.hits))

            def log_engine_initialized(self) -> None:
                pass

        self.steps = steps
        llm = engine._llm.llm_engine if engine.mode == "batch" else engine._async_llm
        self._loggers = llm.logger_manager.stat_loggers
        self._recorder = Recorder()

    def __enter__(self) -> list[tuple[int, int, int]]:
        self._loggers.append(self._recorder)
        return self.steps

    def __exit__(self, *exc: object) -> None:
        self._loggers.remove(self._recorder)


def group_members(step: tuple[int, int, int], blocker: int, member: int) -> int:
    """How many of a step's looked-up requests were the group's, from its token count (the blocker's differs)."""
    requests, tokens, _ = step
    if tokens - blocker == (requests - 1) * member:
        return requests - 1
    assert tokens == requests * member, (step, blocker, member)
    return requests


async def test_requests_sharing_a_new_prefix_submitted_together_compute_it_once(engine: Any) -> None:
    """Eight requests that share a prefix nothing cached before, submitted together: does each compute it?

    A longer request with a prefix of its own goes first, so that several of the eight arrive while
    vLLM prefills it and enter the engine in one step (which ones do is a race with vLLM's engine loop).
    Seen on vLLM's CPU build (blocks of 128 tokens): one computes the prefix, and a request that enters
    in the same step finds its whole blocks cached already (vLLM registers a block in its cache when it
    allocates it; the step writes each layer's keys and values before it attends), as do those that
    enter later. The numbers are printed (`pytest -s`).
    """
    tag = f"together-{engine.mode}"
    blocker = document(f"{tag}-first") + document(f"{tag}-first-too") + "What is item 1?"
    group = [document(tag) + f"What is item {n}?" for n in range(8)]

    with PrefixCacheSteps(engine) as steps:
        first, *answered = await answers(engine, [blocker, *group])

    cached = [one.cached_tokens for one in answered]
    member_tokens = engine.prompt_tokens(group[0])
    members = [group_members(step, first.prompt_tokens, member_tokens) for step in steps]
    print(f"\n{engine.mode}: 8 prompts of {member_tokens} tokens, cached {cached}; the first {first.cached_tokens}")
    print(f"{engine.mode}: steps (requests, tokens looked up, tokens hit) {steps}; group members per step {members}")
    shared = shared_tokens(engine, group[0], group[1])
    hit = max(cached)
    assert first.cached_tokens == 0 and sorted(cached) == [0] + [hit] * 7  # one computes it, seven find it cached
    assert shared // 2 < hit <= shared
    assert sum(step[2] for step in steps) == sum(cached)  # vLLM's scheduler counts the hits that answers report
    together = next(count for count in members if count)  # the group's first step: the prefix is computed in it
    if together > 1:  # others entered with it: they found the blocks it was computing
        assert steps[members.index(together)][2] == (together - 1) * hit
