"""vLLM's automatic prefix caching over the simulated KV cache: blocks, a hash chain, LRU eviction.

The KV cache is `kv_cache_tokens // block_size` blocks of `block_size` tokens. Running sequences
hold blocks for their prompt and generated tokens; a block no sequence holds is free, and a free
block that still has a hash keeps its content: a later prompt that starts with the same tokens finds
it and skips computing them. Where each rule comes from (vLLM 0.32, `vllm/v1/core/`):

- `block_size = 16`: `CacheConfig.DEFAULT_BLOCK_SIZE` (`vllm/config/cache.py`); prefix caching is on
  by default (`CacheConfig.enable_prefix_caching = True`).
- A block's hash chains the previous block's hash and this block's token ids (and the LoRA adapter, an
  extra key): `kv_cache_utils.hash_block_tokens`; only full blocks are hashed (`get_request_block_hasher`).
  vLLM hashes with SHA-256; here Python's 64-bit `hash`, whose collisions are ignored.
- The hit: the longest run of leading full blocks found cached, and at most `prompt_tokens - 1` tokens,
  since the last prompt token is always computed for its logits (`KVCacheManager.get_computed_blocks`,
  `FullAttentionManager.find_longest_cache_hit`). A prompt shorter than a block never hits.
- A block joins the hash table in the step that *schedules* its computation, before the model ran:
  `KVCacheManager.allocate_slots` ends with `coordinator.cache_blocks(request, computed + new tokens)`, and
  `Scheduler.schedule`'s loop over waiting requests calls `get_computed_blocks` then `allocate_slots`
  request by request. So a request scheduled later in the same step finds an earlier one's prefix cached:
  of N requests sharing a prefix admitted in one step, the first computes it and the others hit.
- Hit blocks are pinned (`BlockPool.touch`: reference count + 1, out of the free queue); a block any
  running sequence holds is never evicted.
- Space for a request: its new blocks plus its hit blocks that are free now (touching takes them out of the
  free queue) must not exceed the free blocks (`SingleTypeKVCacheManager.get_num_blocks_to_allocate`).
- Freeing: a request's blocks go back in reverse order, tail first (`SingleTypeKVCacheManager.free`); blocks
  without a hash go to the front of the free queue, blocks with one to its end (`BlockPool.free_blocks`).
  New blocks come from the front (`BlockPool.get_new_blocks`): blank blocks first, then cached ones, least
  recently freed first; taking a cached block drops its hash (`_maybe_evict_cached_block`): an eviction.
- Generated tokens' full blocks get a hash in vLLM too (its output token ids are hashed as they come); the
  simulated engine knows no output token ids, so here they are kept as content no prompt can find: once
  freed they take their place in the LRU order (before the prompt's blocks) and are evicted like any
  cached block, and never hit. A block with no full content (a sequence's last one) is freed blank.

One simplification, the scheduler's: a sequence takes every block of its footprint (prompt + every token it
will generate) when it is admitted, where vLLM takes them chunk by chunk and token by token, so cached blocks
are evicted a little earlier than vLLM would evict them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

ROOT_HASH = 0x5EED_0F_B10C5
"""The parent hash of a prompt's first block (vLLM's `NONE_HASH`)."""


def prefix_block_hashes(token_ids: Sequence[int], block_size: int, adapter: str | None = None) -> tuple[int, ...]:
    """The hash chain of a prompt's full blocks: each hashes the one before it and its own token ids.

    Example:
        ```python
        hashes = prefix_block_hashes(list(range(40)), 16)  # 2 full blocks; the last 8 tokens are no block
        assert hashes[0] == prefix_block_hashes(list(range(16)) + [99] * 24, 16)[0]  # same first block
        ```
    """
    hashes, parent = [], ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size]), adapter))
        hashes.append(parent)
    return tuple(hashes)


@dataclass(frozen=True)
class PrefixCacheStats:
    """What the prefix cache did since it was made (all blocks are `block_size` tokens).

    Attributes:
        requests: Sequences admitted.
        queried_tokens: Their prompt tokens (vLLM's prefix cache `queries`).
        cached_tokens: Prompt tokens found cached, not computed (vLLM's `hits`): `hit_blocks` x `block_size`.
        hit_blocks: Full prompt blocks found cached.
        miss_blocks: Full prompt blocks computed (with caching on, each joins the cache).
        evicted_blocks: Cached blocks whose content was dropped to make space.
    """

    requests: int = 0
    queried_tokens: int = 0
    cached_tokens: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    evicted_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        """The share of prompt tokens found cached."""
        return self.cached_tokens / self.queried_tokens if self.queried_tokens else 0.0


class _Block:
    """Cached content: one block found by its hash, or (`key` `None`) a run of `size` blocks no prompt can find.

    Blocks without content are only counted (`PrefixCache._free_blank`, `_Held.blank`), never made.
    """

    __slots__ = ("key", "refs", "size")

    def __init__(self, key: int | None, refs: int = 1, size: int = 1) -> None:
        self.key, self.refs, self.size = key, refs, size


@dataclass(eq=False)
class _Held:
    """A running sequence's blocks: those with a hash, in token order, then `blank` ones (content not findable).

    Attributes:
        computed_blocks: Full prompt blocks found or computed so far.
    """

    blocks: list[_Block]
    blank: int
    hashes: tuple[int, ...]
    prompt_tokens: int
    cached_tokens: int
    computed_blocks: int


@dataclass(eq=False)
class PrefixCache:
    """A KV cache of `num_blocks` blocks with vLLM's automatic prefix caching (see the module notes).

    Keys are the sequences (any hashable object, each admitted once); not thread-safe.

    Args:
        num_blocks: The cache's size in blocks.
        block_size: Tokens per block.
        enabled: Whether computed blocks are kept for reuse (vLLM's `enable_prefix_caching`); off, every
            prompt is computed whole and a freed block is blank.

    Example:
        ```python
        cache = PrefixCache(num_blocks=8, block_size=4)
        prompt = prefix_block_hashes(list(range(10)), 4)  # 2 full blocks
        assert cache.admit("a", prompt, prompt_tokens=10, footprint=12) == 0
        cache.computed("a", 10)
        cache.release("a", generated=2)
        assert cache.admit("b", prompt, prompt_tokens=10, footprint=12) == 8  # both blocks found
        ```
    """

    num_blocks: int
    block_size: int = 16
    enabled: bool = True
    _free_blank: int = field(init=False)
    _free_cached: int = field(init=False, default=0)
    _lru: OrderedDict[_Block, None] = field(init=False, default_factory=OrderedDict)  # least recently freed first
    _table: dict[int, dict[_Block, None]] = field(init=False, default_factory=dict)
    _held: dict[Any, _Held] = field(init=False, default_factory=dict)
    _stats: dict[str, int] = field(init=False, default_factory=lambda: {f.name: 0 for f in fields(PrefixCacheStats)})

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError(f"a cache needs >= 1 block of >= 1 token, got {self.num_blocks} of {self.block_size}")
        self._free_blank = self.num_blocks

    @property
    def free_blocks(self) -> int:
        """Blocks no sequence holds: blank ones and cached ones (which can be evicted)."""
        return self._free_blank + self._free_cached

    @property
    def cached_blocks(self) -> int:
        """Blocks whose content is kept (held by a sequence or free): prompts' and generated tokens'."""
        return sum(len(blocks) for blocks in self._table.values()) + sum(b.size for b in self._lru if b.key is None)

    @property
    def stats(self) -> PrefixCacheStats:
        """A snapshot of the counts so far."""
        return PrefixCacheStats(**self._stats)

    def blocks_for(self, tokens: int) -> int:
        """Blocks that `tokens` tokens fill (the last one may be part-full)."""
        return -(-tokens // self.block_size)

    def admit(self, sequence: Hashable, hashes: tuple[int, ...], *, prompt_tokens: int, footprint: int) -> int | None:
        """Find the prompt's cached prefix and take every block of the sequence's footprint, if there is space.

        Args:
            sequence: The sequence (a key, not held yet).
            hashes: Its prompt's full blocks' hash chain (`prefix_block_hashes`); `()` for content no other
                prompt shares.
            prompt_tokens: Its prompt's length.
            footprint: Tokens it holds at its end: prompt + generated.

        Returns:
            Prompt tokens found cached (a multiple of `block_size`, < `prompt_tokens`), or `None` when the
            free blocks cannot hold it now (nothing changed then).

        Raises:
            ValueError: The sequence holds blocks already.
        """
        if sequence in self._held:
            raise ValueError(f"{sequence!r} was admitted already: each sequence needs its own key")
        hits = self._longest_hit(hashes[: (prompt_tokens - 1) // self.block_size])
        new_blocks = self.blocks_for(footprint) - len(hits)
        if new_blocks + sum(block.refs == 0 for block in hits) > self.free_blocks:
            return None
        for block in hits:
            if block.refs == 0:
                del self._lru[block]
                self._free_cached -= 1
            block.refs += 1
        self._take(new_blocks)
        cached_tokens = len(hits) * self.block_size
        self._held[sequence] = _Held(hits, new_blocks, hashes, prompt_tokens, cached_tokens, len(hits))
        stats = self._stats
        stats["requests"] += 1
        stats["queried_tokens"] += prompt_tokens
        stats["cached_tokens"] += cached_tokens
        stats["hit_blocks"] += len(hits)
        return cached_tokens

    def computed(self, sequence: Hashable, prompt_tokens_done: int) -> None:
        """The sequence's first `prompt_tokens_done` prompt tokens are scheduled: their full blocks join the cache."""
        held = self._held[sequence]
        full = min(prompt_tokens_done, held.prompt_tokens) // self.block_size
        if full <= held.computed_blocks:
            return
        self._stats["miss_blocks"] += full - held.computed_blocks
        if self.enabled:
            for index in range(held.computed_blocks, min(full, len(held.hashes))):
                block = _Block(held.hashes[index])
                self._table.setdefault(block.key, {})[block] = None  # beside any block of the same content
                held.blocks.append(block)
                held.blank -= 1
        held.computed_blocks = full

    def release(self, sequence: Hashable, generated: int) -> int:
        """The sequence left, having generated `generated` tokens: its blocks are freed, tail first.

        Returns:
            The prompt tokens it had found cached.
        """
        held = self._held.pop(sequence)
        private = 0
        if self.enabled:  # its full blocks without a hash: content kept, though no prompt here can match it
            full = (held.prompt_tokens + generated) // self.block_size if generated else held.computed_blocks
            private = max(0, full - len(held.blocks))
        self._free_blank += held.blank - private  # its last, part-full block (and what it never filled)
        if private:
            self._free_private(private)
        for block in reversed(held.blocks):
            block.refs -= 1
            if not block.refs:
                self._lru[block] = None
                self._free_cached += 1
        return held.cached_tokens

    def _free_private(self, count: int) -> None:
        """`count` freed blocks of content no prompt can find join the LRU order, at its end.

        A run that follows another such run at the end joins it (the two are evicted in the same order
        either way), so that the index holds one entry per run, not one per sequence: a long run of
        prompts that share no block costs the index nothing more.
        """
        last = next(reversed(self._lru), None)
        if last is not None and last.key is None:
            last.size += count
        else:
            self._lru[_Block(None, refs=0, size=count)] = None
        self._free_cached += count

    def _longest_hit(self, hashes: Sequence[int]) -> list[_Block]:
        if not self.enabled:
            return []
        hits = []
        for block_hash in hashes:
            found = self._table.get(block_hash)
            if not found:
                break
            hits.append(next(iter(found)))  # the first block cached under it, as `BlockHashToBlockMap.get_one_block`
        return hits

    def _take(self, count: int) -> None:
        """Take `count` free blocks: blank ones first, then cached ones least recently freed first (evicted)."""
        blank = min(count, self._free_blank)
        self._free_blank -= blank
        evicted = count - blank
        self._free_cached -= evicted
        self._stats["evicted_blocks"] += evicted
        while evicted:
            oldest = next(iter(self._lru))
            if oldest.size > evicted:  # part of a run of generated blocks
                oldest.size -= evicted
                return
            del self._lru[oldest]
            evicted -= oldest.size
            if oldest.key is not None:
                same_key = self._table[oldest.key]
                del same_key[oldest]
                if not same_key:
                    del self._table[oldest.key]
