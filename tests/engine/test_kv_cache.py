"""Block manager: allocation, reference counts, prefix-cache hits keyed by weight version."""

from zeromismatch.engine.kv_cache import BlockManager
from zeromismatch.engine.request import Request
from zeromismatch.engine.sampling_params import SamplingParams


def _request(tokens, arrival=0):
    return Request(str(arrival), list(tokens), SamplingParams(), seed=0, arrival=arrival)


def _compute_all(manager, request, version):
    assert manager.allocate(request, request.num_tokens - request.num_computed_tokens)
    request.num_computed_tokens = request.num_tokens
    request.kv_version = version
    manager.register_computed(request)


def test_allocate_and_free_returns_blocks():
    manager = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    request = _request(range(10))
    assert manager.allocate(request, 10)
    assert len(request.block_ids) == 3 and manager.num_free_blocks == 5
    assert not manager.allocate(_request(range(40), 1), 40)  # needs 10 blocks
    manager.free(request)
    assert manager.num_free_blocks == 8 and request.block_ids == []


def test_prefix_hit_shares_full_blocks_and_leaves_a_token_to_compute():
    manager = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = _request(range(12))
    _compute_all(manager, first, version=0)
    second = _request(range(12), arrival=1)  # same 12 tokens: 3 full blocks, but one token must run
    assert manager.match_prefix(second, version=0) == 8
    assert second.block_ids == first.block_ids[:2]
    assert manager.ref_counts[first.block_ids[0]] == 2
    third = _request([*range(8), 99, 98, 97, 96, 95], arrival=2)
    assert manager.match_prefix(third, version=0) == 8


def test_versioned_cache_never_serves_another_version():
    manager = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True, versioned=True)
    first = _request(range(12))
    _compute_all(manager, first, version=0)
    manager.free(first)  # cached blocks stay, evictable
    assert manager.match_prefix(_request(range(12), 1), version=1) == 0
    assert manager.match_prefix(_request(range(12), 2), version=0) == 8


def test_unversioned_cache_serves_stale_state():
    manager = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True, versioned=False)
    first = _request(range(12))
    _compute_all(manager, first, version=0)
    assert manager.match_prefix(_request(range(12), 1), version=1) == 8


def test_mixed_version_requests_register_nothing():
    manager = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    request = _request(range(12))
    assert manager.allocate(request, 12)
    request.num_computed_tokens = 12
    request.kv_version = None
    manager.register_computed(request)
    assert not manager.block_of_hash


def test_eviction_reuses_cached_blocks_and_drops_their_hash():
    manager = BlockManager(num_blocks=3, block_size=4, enable_prefix_caching=True)
    first = _request(range(8))
    _compute_all(manager, first, version=0)
    manager.free(first)
    assert len(manager.block_of_hash) == 2
    big = _request(range(100, 112), 1)
    assert manager.allocate(big, 12)  # needs all 3 blocks: evicts the cached ones
    assert not manager.block_of_hash
    assert manager.match_prefix(_request(range(8), 2), version=0) == 0


def test_block_hash_fields_cannot_run_into_each_other():
    """The tag, the parent hash and the tokens are length-prefixed: joined bare, version "v1" with a
    first block [12, 5, 6, 7] and "v11" with [2, 5, 6, 7] hashed the same bytes."""
    from zeromismatch.engine.kv_cache import block_hash

    assert block_hash(b"", [12, 5, 6, 7], "v1") != block_hash(b"", [2, 5, 6, 7], "v11")
    assert block_hash(b"", [1, 23], "v0") != block_hash(b"", [12, 3], "v0")
    assert block_hash(b"\x01", [2], "v1") != block_hash(b"", [2], "v1\x01")
    manager = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    _compute_all(manager, _request([12, 5, 6, 7, 8]), version=1)
    assert manager.match_prefix(_request([2, 5, 6, 7, 8], 1), version=11) == 0
    assert manager.stale_hits == 0
