"""Paged KV-cache block manager with a prefix cache keyed by weight version.

Blocks. The cache holds ``num_blocks`` blocks of ``block_size`` token slots; a request
owns a list of block ids (its block table) and token ``p`` of it lives in slot
``block_ids[p // block_size] * block_size + p % block_size``. Blocks are reference
counted: a prefix-cache hit shares a block between requests.

Prefix cache. When a request has computed a *full* block, the block is registered
under a hash chain ``h_i = sha256(version_tag, h_{i-1}, tokens of block i)``. A new
request walks its prompt's full blocks and reuses every leading block whose hash is
registered. Freed blocks with a hash stay cached (evictable, least recently freed
first) until the allocator needs them. With ``versioned=True`` (the default) the
weight version is part of the tag, so state computed under another version is never
served (S2 fix 2); ``versioned=False`` reproduces the unversioned cache of a stock
engine and exists to show stale reuse. Only requests whose K/V was computed entirely
under one version (``Request.kv_version`` not None) register blocks.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict

from .request import Request


def block_hash(parent: bytes, tokens: list[int], version_tag: str) -> bytes:
    """sha256 over the version tag, the parent hash and the block's tokens, each field length-
    prefixed so that no two (tag, parent, tokens) triples feed the hash the same bytes. (Joined bare,
    "v1" with a first block [12, 5, ...] and "v11" with [2, 5, ...] did: a version-11 request was
    served K/V computed under version 1 for another token.)"""
    digest = hashlib.sha256()
    for field in (version_tag.encode(), parent, struct.pack(f"<{len(tokens)}q", *tokens)):
        digest.update(len(field).to_bytes(8, "little"))
        digest.update(field)
    return digest.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, versioned: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.versioned = versioned
        self.ref_counts = [0] * num_blocks
        # free blocks in eviction order (least recently freed first); value unused
        self.free_blocks: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.hash_of_block: dict[int, bytes] = {}
        self.block_of_hash: dict[bytes, int] = {}
        self.hits = 0  # prefix-cache blocks served (for tests and stats)
        # blocks served whose K/V was computed under another weight version: always 0 with a
        # versioned cache; counts the S2 stale-prefix bug when versioning is off
        self.stale_hits = 0
        self.version_of_block: dict[int, int] = {}

    # ---- bookkeeping -------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        total = request.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(request.block_ids))

    def can_allocate(self, request: Request, num_new_tokens: int) -> bool:
        return self.blocks_needed(request, num_new_tokens) <= self.num_free_blocks

    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        """Make ``request.block_ids`` cover ``num_computed_tokens + num_new_tokens`` tokens."""
        need = self.blocks_needed(request, num_new_tokens)
        if need > self.num_free_blocks:
            return False
        for _ in range(need):
            block, _ = self.free_blocks.popitem(last=False)
            self._forget_hash(block)
            self.ref_counts[block] = 1
            request.block_ids.append(block)
        return True

    def free(self, request: Request) -> None:
        # Reverse order: a request's tail blocks are evicted before its (more shareable) head.
        for block in reversed(request.block_ids):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks[block] = None
        request.block_ids = []
        request.num_hashed_blocks = 0
        request.block_hashes = []

    def _forget_hash(self, block: int) -> None:
        self.version_of_block.pop(block, None)
        digest = self.hash_of_block.pop(block, None)
        if digest is not None and self.block_of_hash.get(digest) == block:
            del self.block_of_hash[digest]

    def clear_prefix_cache(self) -> None:
        """Drop every registered hash (blocks in use stay allocated)."""
        self.hash_of_block.clear()
        self.block_of_hash.clear()
        self.version_of_block.clear()

    # ---- prefix cache ------------------------------------------------------
    def _tag(self, version: int) -> str:
        return f"v{version}" if self.versioned else "unversioned"

    def match_prefix(self, request: Request, version: int) -> int:
        """Attach the longest cached run of the prompt's full blocks to a fresh request.

        At least one prompt token is always left to compute (its logits sample the first
        output token). Returns the number of tokens served from the cache."""
        if not self.enable_prefix_caching or request.block_ids:
            return 0
        tokens = request.all_token_ids
        max_blocks = (len(tokens) - 1) // self.block_size
        parent = b""
        hashes, blocks = [], []
        for i in range(max_blocks):
            digest = block_hash(
                parent, tokens[i * self.block_size : (i + 1) * self.block_size], self._tag(version)
            )
            block = self.block_of_hash.get(digest)
            if block is None:
                break
            hashes.append(digest)
            blocks.append(block)
            parent = digest
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]
            self.ref_counts[block] += 1
            if self.version_of_block.get(block, version) != version:
                self.stale_hits += 1
        self.hits += len(blocks)
        request.block_ids = blocks
        request.block_hashes = hashes
        request.num_hashed_blocks = len(blocks)
        request.num_computed_tokens = len(blocks) * self.block_size
        return request.num_computed_tokens

    def cancel_prefix_match(self, request: Request, version: int) -> None:
        """Take back the hit counts of ``match_prefix`` for a request whose admission then failed
        (the scheduler frees its blocks and matches again on a later step): a block counts as
        served only once it is actually used."""
        matched = request.block_ids[: request.num_hashed_blocks]
        self.hits -= len(matched)
        self.stale_hits -= sum(self.version_of_block.get(block, version) != version for block in matched)

    def register_computed(self, request: Request) -> None:
        """Register the request's newly completed full blocks (called after a forward)."""
        if not self.enable_prefix_caching or request.kv_version is None:
            return
        tokens = request.all_token_ids
        num_full = request.num_computed_tokens // self.block_size
        tag = self._tag(request.kv_version)
        while request.num_hashed_blocks < num_full:
            i = request.num_hashed_blocks
            parent = request.block_hashes[i - 1] if i else b""
            digest = block_hash(parent, tokens[i * self.block_size : (i + 1) * self.block_size], tag)
            block = request.block_ids[i]
            if digest not in self.block_of_hash and block not in self.hash_of_block:
                self.block_of_hash[digest] = block
                self.hash_of_block[block] = digest
                self.version_of_block[block] = request.kv_version
            request.block_hashes.append(digest)
            request.num_hashed_blocks += 1
