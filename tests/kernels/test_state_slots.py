"""The per-slot Mamba2 state contract of ``causal_conv1d`` / ``ssm_scan`` (``KernelSet``): with
``state_slots`` the op reads each sequence's initial state from its row of a per-slot store (zeros
where ``has_initial_state`` is False, whatever the row holds), writes the final state back to that
row in place, and leaves every other row alone -- bit for bit what the gather, the op on the
gathered states, and a scatter back compute, in every kernel set. The native set reads and writes
the store in place (no gather copy); its column-slice inputs are read in place too."""

from __future__ import annotations

import pytest
import torch

from zeromismatch.kernels import get_kernels

SETS = ["default", "aligned", "aligned-native"]
SLOTS = 6


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])


def _conv_case(gen, lens, channels=40, width=4):
    total = sum(lens)
    return dict(
        x=torch.randn(total, channels, generator=gen),
        weight=torch.randn(channels, width, generator=gen),
        bias=torch.randn(channels, generator=gen),
        cu_seqlens=_cu(lens),
    ), torch.randn(SLOTS, channels, width - 1, generator=gen)


def _scan_case(gen, lens, heads=4, head_dim=8, groups=2, n_state=16):
    total = sum(lens)
    return dict(
        x=torch.randn(total, heads, head_dim, generator=gen),
        dt=torch.randn(total, heads, generator=gen),
        A=-torch.rand(heads, generator=gen) * 4,
        B=torch.randn(total, groups, n_state, generator=gen),
        C=torch.randn(total, groups, n_state, generator=gen),
        D=torch.randn(heads, generator=gen),
        dt_bias=torch.randn(heads, generator=gen),
        cu_seqlens=_cu(lens),
    ), torch.randn(SLOTS, heads, head_dim, n_state, generator=gen)


def _run(ks, op, inputs, state, **slots):
    if op == "causal_conv1d":
        return ks.causal_conv1d(**inputs, conv_state=state, activation="silu", **slots)
    return ks.ssm_scan(**inputs, ssm_state=state, dt_limit=(0.001, float("inf")), **slots)


@pytest.mark.parametrize("kernels", SETS)
@pytest.mark.parametrize("op", ["causal_conv1d", "ssm_scan"])
@pytest.mark.parametrize("lens", [[1, 1, 1], [3, 1, 5]], ids=["decode", "mixed"])
def test_slots_are_the_gather_then_the_op_then_the_scatter(kernels, op, lens):
    ks = get_kernels(kernels)
    gen = torch.Generator().manual_seed(len(lens) + sum(lens))
    inputs, store = (_conv_case if op == "causal_conv1d" else _scan_case)(gen, lens)
    slots = torch.tensor([4, 0, 2])
    has_initial = torch.tensor([True, False, True])
    gathered = store[slots].clone()
    gathered[1] = 0  # the fresh sequence starts from zeros, not from what its row holds
    y_expected, final_expected = _run(ks, op, inputs, gathered)

    updated = store.clone()
    with torch.no_grad():
        y, returned = _run(ks, op, inputs, updated, state_slots=slots, has_initial_state=has_initial)
    assert returned is updated  # the store itself, updated in place
    assert torch.equal(y, y_expected)
    assert torch.equal(updated[slots], final_expected.to(updated.dtype))
    untouched = [row for row in range(SLOTS) if row not in slots.tolist()]
    assert torch.equal(updated[untouched], store[untouched])
    # without has_initial_state every sequence continues from its row
    again = store.clone()
    with torch.no_grad():
        y_all, _ = _run(ks, op, inputs, again, state_slots=slots)
    assert torch.equal(y_all, _run(ks, op, inputs, store[slots].clone())[0])


@pytest.mark.parametrize("kernels", SETS)
def test_engine_column_slices_give_the_contiguous_bits(kernels):
    """The mixer hands the ops column slices of its projection; each set gives the bits of the same
    values laid out contiguously (the native set reads the slices in place)."""
    ks = get_kernels(kernels)
    gen = torch.Generator().manual_seed(7)
    inputs, _ = _scan_case(gen, [2, 1, 3])
    wide = {}
    for name in ("x", "dt", "B", "C"):
        t = inputs[name]
        padded = torch.randn(t.shape[0], t[0].numel() + 5, generator=gen)
        padded[:, 3 : 3 + t[0].numel()] = t.reshape(t.shape[0], -1)
        wide[name] = padded[:, 3 : 3 + t[0].numel()].view(t.shape)
        assert not wide[name].is_contiguous()
    sliced = _run(ks, "ssm_scan", {**inputs, **wide}, None)
    dense = _run(ks, "ssm_scan", inputs, None)
    assert all(torch.equal(a, b) for a, b in zip(sliced, dense))


@pytest.mark.parametrize("op", ["causal_conv1d", "ssm_scan"])
def test_bad_slots_are_one_clear_error(op):
    ks = get_kernels("aligned-native")
    gen = torch.Generator().manual_seed(3)
    inputs, store = (_conv_case if op == "causal_conv1d" else _scan_case)(gen, [1, 1])
    name = "conv_state" if op == "causal_conv1d" else "ssm_state"
    cases = [
        (dict(state_slots=torch.tensor([0, SLOTS])), "outside"),
        (dict(state_slots=torch.tensor([1, 1])), "distinct"),
        (dict(state_slots=torch.tensor([0, 1], dtype=torch.int32)), "int64"),
        (dict(state_slots=torch.tensor([0])), r"\[S=2\]"),
        (dict(state_slots=torch.tensor([0, 1]), has_initial_state=torch.tensor([1, 0])), "bool"),
    ]
    with torch.no_grad():
        for slots, message in cases:
            before = store.clone()
            with pytest.raises(ValueError, match=message):
                _run(ks, op, inputs, store, **slots)
            assert torch.equal(store, before)  # nothing written
        with pytest.raises(ValueError, match="needs state_slots"):
            _run(ks, op, inputs, None, has_initial_state=torch.tensor([True, True]))
        with pytest.raises(ValueError, match=f"needs {name}"):
            _run(ks, op, inputs, None, state_slots=torch.tensor([0, 1]))
    # an op that wrote its store cannot be recomputed for a backward: slots need no_grad
    with pytest.raises(ValueError, match="no_grad"):
        _run(ks, op, inputs, store, state_slots=torch.tensor([0, 1]))
    store.requires_grad_(True)
    with pytest.raises(ValueError, match="no_grad"):
        _run(ks, op, inputs, store, state_slots=torch.tensor([0, 1]))


@pytest.mark.parametrize("op", ["causal_conv1d", "ssm_scan"])
def test_a_store_of_another_dtype_changes_only_the_batch_rows(op):
    """A store the native kernels cannot update in place (another dtype than the activations for the
    conv, not fp32 for the scan) goes through a gather and a scatter: the other slots keep their
    bits (found in review: a whole-store round trip through bf16 rounded them) and the batch's rows
    get the aligned-native bits of the gathered call."""
    gen = torch.Generator().manual_seed(11)
    inputs, store = (_conv_case if op == "causal_conv1d" else _scan_case)(gen, [1, 1, 1])
    if op == "causal_conv1d":
        inputs = {**inputs, "x": inputs["x"].bfloat16()}  # an fp32 store, bf16 activations
    else:
        store = store.bfloat16()  # a bf16 store, fp32 arithmetic
    ks = get_kernels("aligned-native")
    slots, has_initial = torch.tensor([4, 0, 2]), torch.tensor([True, False, True])
    gathered = store[slots].clone()
    gathered[1] = 0
    y_expected, final_expected = _run(ks, op, inputs, gathered)
    updated = store.clone()
    with torch.no_grad():
        y, _ = _run(ks, op, inputs, updated, state_slots=slots, has_initial_state=has_initial)
    assert torch.equal(y, y_expected)
    assert torch.equal(updated[slots], final_expected.to(updated.dtype))
    assert torch.equal(updated[[1, 3, 5]], store[[1, 3, 5]])
