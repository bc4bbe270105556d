"""The aligned attention's all-decode plan (built every engine step) is the general plan.

``_plan_decode`` is a shortcut for the plan ``_plan_group`` builds when every sequence of a
step has one query; both decide only which numbers meet in which op, so they must agree field
for field (index tensors compared with ``torch.equal``). The bitwise consequence (decode ==
prefill == trainer) is tested in tests/kernels/test_attention.py and tests/parity/.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromismatch.kernels.aligned import attention


@settings(max_examples=40, deadline=None)
@given(
    kv_lens=st.lists(st.integers(1, 200), min_size=1, max_size=9),
    group=st.sampled_from([1, 2, 3, 4, 8, 16]),
    block_size=st.sampled_from([1, 3, 16, 64]),
    seed=st.integers(0, 2**16),
)
def test_decode_plan_equals_general_plan(kv_lens, group, block_size, seed):
    num_seqs = len(kv_lens)
    per_seq = max(-(-n // block_size) for n in kv_lens)
    table = torch.randint(0, 1000, (num_seqs, per_seq), generator=torch.Generator().manual_seed(seed))
    cu = list(range(num_seqs + 1))

    def key_index(seqs, pos):
        blk = (pos // block_size).clamp(max=per_seq - 1)
        return table[seqs][:, blk] * block_size + (pos % block_size)[None, :]

    (fast,) = attention._build_plan(cu, kv_lens, key_index, 2, group, "cpu")
    seqs = list(range(num_seqs))
    general = attention._plan_group(cu, [1] * num_seqs, kv_lens, key_index, seqs, 2, group, "cpu")
    for name in ("nseq", "slots", "kept_slots", "n_blocks", "pick"):
        assert getattr(fast, name) == getattr(general, name), name
    for name in ("q_index", "kv_rows", "out_tokens"):
        assert torch.equal(getattr(fast, name), getattr(general, name)), name
    if general.invalid_rows is None:
        assert fast.invalid_rows is None
    else:
        assert torch.equal(fast.invalid_rows, general.invalid_rows)
    (fast_tile,), (general_tile,) = fast.tiles, general.tiles
    for name in ("lo", "hi", "start", "n_blocks", "real"):
        assert getattr(fast_tile, name) == getattr(general_tile, name), name
    assert torch.equal(fast_tile.blocked, general_tile.blocked)
    assert torch.equal(fast_tile.active, general_tile.active)


def test_mixed_steps_take_the_general_plan():
    def key_index(seqs, pos):
        return seqs[:, None] * 1000 + pos[None, :]

    groups = attention._build_plan([0, 1, 4], [5, 9], key_index, 2, 2, "cpu")
    assert [g.nseq for g in groups] == [2] and groups[0].slots == 8 and groups[0].kept_slots == 3
