"""The simulated engine's prefix cache: vLLM's blocks, hash chain and LRU eviction, counted exactly.

Blocks are 4 tokens in the hand-worked cases. Each expected figure is worked out in the comments from the
rules in `_prefix_cache.py`'s notes: the hit is the longest run of leading full blocks cached, never the
prompt's last token; blank free blocks are taken before cached ones, cached ones least recently freed
first, a finished sequence's tail before its head; blocks a running sequence holds are never evicted.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from flyteplugins_batcher.engines import Completion, GenerationConfig, Request
from flyteplugins_batcher.engines.simulated import OutputLengths, SimulatedEngine, SimulatedGpu
from flyteplugins_batcher.engines.simulated._continuous_batching import ContinuousBatchScheduler, SequenceJob
from flyteplugins_batcher.engines.simulated._prefix_cache import PrefixCache, PrefixCacheStats, prefix_block_hashes
from flyteplugins_batcher.engines.simulated._tokenizer import SimulatedTokenizer


def run(cache: PrefixCache, name: str, token_ids: list[int], generated: int = 1, adapter: str | None = None) -> int:
    """One sequence start to end: admitted, its whole prompt computed, released. Returns its cached tokens."""
    cached = cache.admit(
        name,
        prefix_block_hashes(token_ids, cache.block_size, adapter),
        prompt_tokens=len(token_ids),
        footprint=len(token_ids) + generated,
    )
    assert cached is not None, f"{name} found no room"
    cache.computed(name, len(token_ids))
    assert cache.release(name, generated) == cached
    return cached


def counts(cache: PrefixCache) -> tuple[int, int, int, int]:
    stats = cache.stats
    return stats.hit_blocks, stats.miss_blocks, stats.evicted_blocks, stats.cached_tokens


# -- the cache alone ----------------------------------------------------------------------------------------------


def test_the_hash_chain_covers_full_blocks_and_each_hash_depends_on_every_token_before_it() -> None:
    hashes = prefix_block_hashes(list(range(11)), 4)

    assert len(hashes) == 2  # 11 tokens: 2 full blocks, the last 3 tokens are no block
    assert prefix_block_hashes([*list(range(8)), 50, 51], 4) == hashes
    assert prefix_block_hashes([9, 1, 2, 3, 4, 5, 6, 7], 4)[1] != hashes[1]  # same 2nd block, another 1st
    assert prefix_block_hashes(list(range(8)), 4, adapter="sql")[0] != hashes[0]  # a LoRA adapter is a key
    assert prefix_block_hashes([1, 2, 3], 4) == ()


def test_a_prompt_hits_its_longest_run_of_leading_full_blocks_and_never_its_last_token() -> None:
    cache = PrefixCache(num_blocks=64, block_size=4)
    document = list(range(100, 112))  # 3 full blocks

    assert run(cache, "first", [*document, 1]) == 0  # computes 3 full blocks
    assert run(cache, "longer", [*document, 2, 3]) == 12  # all 3 found; 14 tokens: nothing more is full
    assert run(cache, "exact", document) == 8  # 12 tokens, all cached: the 12th is computed, so block 3 too
    assert run(cache, "diverges", document[:6] + [7] * 6) == 4  # block 2 differs: only block 1 is found
    assert run(cache, "short", [100, 101, 102]) == 0  # shorter than a block: nothing to find or keep
    assert run(cache, "adapter", [*document, 1], adapter="sql") == 0  # another adapter's blocks are others

    # misses: first 3, exact 1 (block 3 again), diverges 2, adapter 3; hits: 3 + 2 + 1 blocks of 4 tokens
    assert counts(cache) == (6, 9, 0, 24)
    assert cache.stats == PrefixCacheStats(
        requests=6, queried_tokens=13 + 14 + 12 + 12 + 3 + 13, cached_tokens=24, hit_blocks=6, miss_blocks=9
    )
    assert cache.stats.hit_rate == pytest.approx(24 / 67)


def test_free_cached_blocks_are_evicted_least_recently_used_first_after_the_blank_ones() -> None:
    cache = PrefixCache(num_blocks=3, block_size=4)
    a, b, c = [1] * 5, [2] * 5, [3] * 5  # each holds 2 blocks (5 + 1 tokens) and leaves 1 cached: its prompt's

    run(cache, "a", a)  # blank 2, cached [a]
    run(cache, "b", b)  # takes the 2 blank ones first: blank 1, cached [a, b]
    run(cache, "c", c)  # 1 blank + a evicted: cached [b, c]
    assert counts(cache) == (0, 3, 1, 0)

    assert run(cache, "b again", b) == 4  # b is found and used: cached [c, b]
    assert run(cache, "a again", a) == 0  # a was evicted; this evicts c, the least recently used, not b
    assert run(cache, "b once more", b) == 4  # b survived
    assert run(cache, "c again", c) == 0  # c did not
    assert counts(cache) == (2, 5, 3, 8)  # evictions: a, then c, then a's second copy (the LRU by then)


def test_a_finished_sequences_tail_is_evicted_before_its_head() -> None:
    cache = PrefixCache(num_blocks=4, block_size=4)
    prompt = [5] * 12 + [6]  # 3 full blocks

    run(cache, "a", prompt, generated=3)  # 16 tokens, 4 full blocks: its prompt's 3, and 1 its last tokens fill
    assert (cache.cached_blocks, cache.free_blocks) == (4, 4)  # freed, all kept: a generated block is cached too

    run(cache, "b", [7, 7, 7], generated=2)  # 5 tokens, 2 blocks: a's 2 last blocks evicted (generated, 3rd prompt)
    assert run(cache, "a again", prompt) == 8  # a's first 2 blocks survived
    # a: 3 misses; b: 2 evictions, then leaves 1 cached (its 4 computed tokens) and 1 blank; "a again": 2 hits,
    # 1 miss (its 3rd block), the blank block and b's cached one for its 2 new blocks (1 more eviction)
    assert counts(cache) == (2, 4, 3, 8)


def test_room_for_a_sequence_counts_the_free_cached_blocks_its_hit_takes() -> None:
    cache = PrefixCache(num_blocks=3, block_size=4)
    run(cache, "a", [1] * 5)  # leaves [a]: 1 cached, 2 blank
    run(cache, "x", [2] * 5)  # leaves [a, x]: 2 cached, 1 blank
    assert cache.admit("blocker", (), prompt_tokens=3, footprint=4) == 0  # holds the blank one

    hashes = prefix_block_hashes([1] * 5, 4)
    assert cache.admit("a long", hashes, prompt_tokens=5, footprint=12) is None  # a's block + 2 new > 2 free
    assert cache.admit("a short", hashes, prompt_tokens=5, footprint=8) == 4  # a's block + 1 new: x is evicted
    assert (cache.free_blocks, cache.stats.evicted_blocks) == (0, 1)


def test_blocks_a_running_sequence_holds_are_never_evicted_and_others_share_them() -> None:
    cache = PrefixCache(num_blocks=5, block_size=4)
    shared = list(range(8))  # 2 full blocks
    run(cache, "old", [9] * 4 + [0])  # leaves 1 cached block behind: blank 4, cached [old]

    assert cache.admit("a", prefix_block_hashes([*shared, 1], 4), prompt_tokens=9, footprint=12) == 0
    cache.computed("a", 9)  # a runs, holding 3 blocks: free are 1 blank and old's cached one

    assert cache.admit("b", prefix_block_hashes([7] * 9, 4), prompt_tokens=9, footprint=12) is None  # 3 > 2 free
    assert cache.admit("c", prefix_block_hashes([*shared, 2], 4), prompt_tokens=9, footprint=12) == 8  # 1 new block
    assert cache.free_blocks == 1 and counts(cache) == (2, 3, 0, 8)  # nothing evicted: c took the last blank block
    assert cache.admit("d", prefix_block_hashes([*shared, 3], 4), prompt_tokens=9, footprint=12) == 8
    assert (cache.free_blocks, cache.stats.evicted_blocks) == (0, 1)  # old's block, the only one not held
    with pytest.raises(ValueError, match="admitted already"):
        cache.admit("a", (), prompt_tokens=9, footprint=12)


def test_with_caching_off_every_prompt_is_computed_whole_and_nothing_is_kept() -> None:
    cache = PrefixCache(num_blocks=4, block_size=4, enabled=False)
    document = list(range(12))

    assert [run(cache, name, [*document, 1]) for name in ("a", "b", "c")] == [0, 0, 0]
    assert counts(cache) == (0, 9, 0, 0)  # 3 blocks computed each time, none found, none kept to evict
    assert (cache.cached_blocks, cache.free_blocks) == (0, 4)


# -- the scheduler ------------------------------------------------------------------------------------------------

GPU = SimulatedGpu(
    step_base_s=1.0,
    decode_seq_s=0.1,
    prefill_token_s=0.01,
    max_num_seqs=4,
    max_num_batched_tokens=64,
    kv_cache_tokens=400,
    max_model_len=100,
    block_size=4,
)
"""Blocks of 4 tokens, round step times: every step below can be checked by hand."""


def job(token_ids: list[int], output_tokens: int, tag: str, gpu: SimulatedGpu = GPU) -> SequenceJob:
    hashes = prefix_block_hashes(token_ids, gpu.block_size) if gpu.enable_prefix_caching else ()
    return SequenceJob(len(token_ids), output_tokens, tag, hashes)


def steps_of(scheduler: ContinuousBatchScheduler) -> list:
    steps = []
    while not scheduler.idle:
        steps.append(scheduler.step())
    return steps


@pytest.mark.parametrize("caching", [True, False])
def test_requests_admitted_in_one_step_find_the_prefix_the_first_of_them_computes(caching: bool) -> None:
    gpu = replace(GPU, enable_prefix_caching=caching)
    scheduler = ContinuousBatchScheduler(gpu)
    document = list(range(100, 116))  # 4 full blocks
    jobs = [job(document + [index] * 3, 2, f"q{index}", gpu) for index in range(3)]  # 19 tokens each
    for each in jobs:
        scheduler.submit(each)

    first, second = steps_of(scheduler)

    cached = 16 if caching else 0  # vLLM's allocate_slots caches q0's blocks as it schedules them
    assert first.prefill_tokens == 19 + 2 * (19 - cached)  # 57 tokens, or 25 with the cache
    assert first.step_s == pytest.approx(1.0 + 0.01 * (57 - 2 * cached))  # the cached tokens' prefill cost less
    assert second.cached_tokens == {jobs[0]: 0, jobs[1]: cached, jobs[2]: cached}
    assert scheduler.cache.stats.hit_blocks == (8 if caching else 0)
    assert scheduler.cache.stats.miss_blocks == (4 if caching else 12)


def test_a_prompt_chunked_over_steps_caches_each_chunks_blocks_as_it_is_scheduled() -> None:
    gpu = replace(GPU, max_num_batched_tokens=10)
    scheduler = ContinuousBatchScheduler(gpu)
    long, follower = job(list(range(16)), 1, "long", gpu), job(list(range(12)) + [7] * 4, 1, "follower", gpu)
    scheduler.submit(long)
    scheduler.submit(follower)

    steps = steps_of(scheduler)

    # Step 1: 10 of long's 16 tokens (blocks 1-2 cached), no budget left. Step 2: long's last 6 (blocks 3-4), then
    # follower finds blocks 1-3 (its 4th differs) and computes its last 4 tokens in the 4 tokens of budget left.
    assert [(step.prefill_tokens, [each.tag for each in step.finished]) for step in steps] == [
        (10, []),
        (10, ["long", "follower"]),
    ]
    assert steps[1].cached_tokens == {long: 0, follower: 12}


def test_sequences_sharing_a_prefix_fit_together_where_copies_would_not() -> None:
    def running(caching: bool) -> list[int]:
        # 4 blocks of room; each sequence holds 3 (12 tokens: 9 prompt + 3 generated), 2 of them its prompt's prefix
        gpu = replace(GPU, kv_cache_tokens=16, max_model_len=16, enable_prefix_caching=caching)
        scheduler = ContinuousBatchScheduler(gpu)
        for index in range(2):
            scheduler.submit(job([*list(range(8)), index], 3, str(index), gpu))
        return [step.running for step in steps_of(scheduler)]

    assert running(True) == [2, 2, 2]  # the 2nd shares the prefix the 1st is computing: 3 + 1 blocks fit
    assert running(False) == [1, 1, 1, 1, 1, 1]  # 3 + 3 do not: the 2nd waits for the 1st to leave


def test_a_cache_too_small_for_two_groups_prefixes_keeps_neither() -> None:
    # Room for one sequence (3 blocks: 2 of its group's prefix, 1 for its own tail and token); one slot.
    gpu = replace(GPU, max_num_seqs=1, kv_cache_tokens=12, max_model_len=12)
    scheduler = ContinuousBatchScheduler(gpu)
    groups = {"x": list(range(8)), "y": list(range(50, 58))}
    for name in ("x", "y", "x", "y"):
        scheduler.submit(job(groups[name] + [1, 2], 2, name, gpu))  # 10 + 2 tokens: 3 full blocks at its end

    steps = steps_of(scheduler)

    # Each evicts all 3 blocks the one before left (2 prefix blocks and a generated one): nothing is ever found.
    assert scheduler.cache.stats == PrefixCacheStats(requests=4, queried_tokens=40, miss_blocks=8, evicted_blocks=9)
    assert sum(step.prefill_tokens for step in steps) == 40
    with pytest.raises(ValueError, match=r"a job of 16 tokens \(4 blocks of 4\) cannot fit a KV cache of 12 tokens"):
        scheduler.submit(job(list(range(14)), 2, "too long", gpu))
    with pytest.raises(ValueError, match="a prompt of 9 tokens has 2 full blocks of 4, got 1 block hashes"):
        scheduler.submit(SequenceJob(9, 2, "bad", (123,)))


def test_the_gpu_checks_its_blocks_and_the_switch() -> None:
    with pytest.raises(
        ValueError, match=r"max_model_len \(20\) must fit in the KV cache \(20 tokens: 1 blocks of 16\)"
    ):
        SimulatedGpu(kv_cache_tokens=20, max_model_len=20)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        SimulatedGpu(block_size=0)
    with pytest.raises(ValueError, match="enable_prefix_caching must be true or false, got 'no'"):
        SimulatedGpu(enable_prefix_caching="no")
    assert SimulatedGpu().kv_cache_tokens // SimulatedGpu().block_size == 27_648  # vLLM's 16-token blocks


# -- the engine ---------------------------------------------------------------------------------------------------

DOCUMENT = "The quarterly report says revenue grew in every region but one. " * 40
"""2,600 characters: 650 tokens, over 40 full blocks of 16."""


def engine_with(caching: bool) -> SimulatedEngine:
    engine = SimulatedEngine(
        gpu=SimulatedGpu(enable_prefix_caching=caching),
        output_lengths=OutputLengths(mean=3, spread=0.0),
        time_scale=50,
    )
    engine.load()
    return engine


def shared_tokens(first: str, second: str, block_size: int = 16) -> int:
    """Tokens the two prompts share from the start once rendered, in whole blocks."""
    one, two = (
        SimulatedTokenizer().apply_chat_template([{"role": "user", "content": text}], tokenize=True)
        for text in (first, second)
    )
    common = next(
        (index for index, (a, b) in enumerate(zip(one, two, strict=False)) if a != b), min(len(one), len(two))
    )
    return common // block_size * block_size


async def test_completions_report_the_prompt_tokens_found_cached() -> None:
    engine = engine_with(caching=True)
    questions = [f"{DOCUMENT}\nQuestion {index}: which region did not grow?" for index in range(3)]
    distinct = [f"{index}: {'what is the answer? ' * 20}" for index in range(2)]
    try:
        together = await engine.generate(questions[:2])  # the 2nd finds the blocks the 1st is computing
        [later] = await engine.generate(questions[2:])  # finds them cached after both left
        apart = await engine.generate(distinct)
        stats = engine.prefix_cache_stats
    finally:
        engine.close()

    shared = shared_tokens(questions[0], questions[1])
    assert shared == (len("USR:") + len(DOCUMENT) + len("\nQuestion ")) // 4 // 16 * 16 > 600
    assert all(isinstance(answer, Completion) for answer in [*together, later, *apart])
    assert [answer.cached_tokens for answer in together] == [0, shared]
    assert later.cached_tokens == shared
    assert [answer.cached_tokens for answer in apart] == [0, 0]
    assert (stats.requests, stats.cached_tokens, stats.hit_blocks, stats.evicted_blocks) == (5, 2 * shared, 80, 0)


@pytest.mark.parametrize("caching", [True, False])
async def test_a_repeated_prompt_costs_its_cached_tokens_prefill_less(caching: bool) -> None:
    engine = engine_with(caching)
    prompt = Request(f"{DOCUMENT}\nSummarize it.", GenerationConfig(max_new_tokens=8))
    try:
        before = engine.stats
        [cold] = await engine.generate([prompt])
        middle = engine.stats
        [warm] = await engine.generate([prompt])
        after = engine.stats
    finally:
        engine.close()

    first, second = middle.since(before), after.since(middle)
    assert first.steps == second.steps == 3  # a prefill step that samples the 1st token, 2 decode steps
    every_block_but_the_last_token = (warm.prompt_tokens - 1) // 16 * 16
    assert warm.cached_tokens == (every_block_but_the_last_token if caching else 0)
    assert cold.cached_tokens == 0 and warm.completion_tokens == cold.completion_tokens
    saved = first.step_time_s - second.step_time_s
    assert saved == pytest.approx(engine.gpu.prefill_token_s * warm.cached_tokens)


def test_the_offline_ideal_counts_the_cache_too() -> None:
    questions = [f"{DOCUMENT}\nQuestion {index}: which region?" for index in range(8)]
    on, off = engine_with(caching=True), engine_with(caching=False)
    try:
        ideal_on, ideal_off = on.ideal_run(questions), off.ideal_run(questions)
    finally:
        on.close()
        off.close()

    shared = shared_tokens(questions[0], questions[1])
    assert ideal_on.prefix_cache.cached_tokens == 7 * shared and ideal_off.prefix_cache.cached_tokens == 0
    assert ideal_off.prefill_tokens - ideal_on.prefill_tokens == 7 * shared
    assert ideal_off.makespan_s - ideal_on.makespan_s == pytest.approx(7 * shared * on.gpu.prefill_token_s)


def test_the_index_keeps_one_entry_per_run_of_blocks_no_prompt_can_find_and_evicts_them_exactly() -> None:
    cache = PrefixCache(num_blocks=10, block_size=4)
    for number in range(4):  # 3-token prompts (no full block to hash) that generate 5: 2 full blocks each, kept
        run(cache, f"short {number}", [number] * 3, generated=5)
    assert (cache.cached_blocks, cache.free_blocks, len(cache._lru)) == (8, 10, 1)  # one run of 8, not 4 of 2

    run(cache, "long", [9] * 12 + [8], generated=3)  # 16 tokens, 4 blocks: the 2 blank ones, then 2 evicted
    assert counts(cache) == (0, 3, 2, 0)  # its 3 prompt blocks computed; 2 of the run's 8 blocks evicted
    # freed tail first: long's generated block joins the run (now 7, nothing between them), then its 3 prompt blocks
    assert (cache.cached_blocks, cache.free_blocks, len(cache._lru)) == (10, 10, 4)
