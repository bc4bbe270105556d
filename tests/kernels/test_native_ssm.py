"""The aligned-native set's C Mamba2 scan: one call == any split carrying the state == single
decode steps (``torch.equal``), the same bits from an ``-O0`` build, accuracy and gradients
against a float64 recurrence with stated tolerances. The default set's scan (chunked SSD) is
the contrast: tests/kernels/test_ssm.py shows it breaking the same property."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import torch_threads

from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.native import NativeKernels, _build

pytestmark = pytest.mark.native  # skipped without a C compiler, except under CI (tests/conftest.py)

NATIVE = NativeKernels()  # builds the library on first use, not at import
ALIGNED = get_kernels("aligned")


def _inputs(gen, total, heads, head_dim, groups, n_state, dtype=torch.float32):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    return dict(
        x=rnd(total, heads, head_dim).to(dtype),
        dt=rnd(total, heads).to(dtype),
        A=-torch.rand(heads, generator=gen) * 4,
        B=rnd(total, groups, n_state).to(dtype),
        C=rnd(total, groups, n_state).to(dtype),
        D=rnd(heads),
        dt_bias=rnd(heads),
    )


def _rows(inp, lo, hi):
    return {k: (v[lo:hi] if k in ("x", "dt", "B", "C") else v) for k, v in inp.items()}


def _scan(kernels, inp, lens, state=None, **kwargs):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    return kernels.ssm_scan(**inp, cu_seqlens=cu, ssm_state=state, **kwargs)


@settings(max_examples=30, deadline=None)
@given(
    groups=st.integers(1, 3),
    per_group=st.integers(1, 3),
    head_dim=st.integers(1, 20),
    n_state=st.integers(1, 40),
    length=st.integers(1, 24),
    split=st.integers(0, 24),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_whole_split_and_steps_are_bitwise_equal(
    groups, per_group, head_dim, n_state, length, split, dtype, seed
):
    gen = torch.Generator().manual_seed(seed)
    heads = groups * per_group
    inp = _inputs(gen, length, heads, head_dim, groups, n_state, dtype)
    start = torch.randn(1, heads, head_dim, n_state, generator=gen)
    y, state = _scan(NATIVE, inp, [length], start)
    cut = min(split, length - 1)
    if cut > 0:
        y1, s1 = _scan(NATIVE, _rows(inp, 0, cut), [cut], start)
        y2, s2 = _scan(NATIVE, _rows(inp, cut, length), [length - cut], s1)
        assert torch.equal(torch.cat([y1, y2]), y) and torch.equal(s2, state)
    steps, s = [], start
    for t in range(length):
        y_t, s = _scan(NATIVE, _rows(inp, t, t + 1), [1], s)
        steps.append(y_t)
    assert torch.equal(torch.cat(steps), y) and torch.equal(s, state)


def test_other_sequences_threads_and_views_change_nothing():
    gen = torch.Generator().manual_seed(1)
    inp = _inputs(gen, 30, 4, 8, 2, 16)
    with torch_threads(1):
        y, state = _scan(NATIVE, inp, [10, 0, 20])  # an empty sequence in between
    with torch_threads(2):
        assert all(torch.equal(a, b) for a, b in zip(_scan(NATIVE, inp, [10, 0, 20]), (y, state)))
    y_alone, state_alone = _scan(NATIVE, _rows(inp, 10, 30), [20])
    assert torch.equal(y[10:], y_alone) and torch.equal(state[2:], state_alone)
    assert not state[1].any()  # the empty sequence keeps its (zero) initial state
    # a lazily negated view (its storage holds the un-negated values) is read as its values
    lazy_a = torch._neg_view(-inp["A"])  # values A, contiguous storage holding -A
    assert lazy_a.is_neg() and lazy_a.is_contiguous() and torch.equal(lazy_a, inp["A"])
    assert torch.equal(_scan(NATIVE, {**inp, "A": lazy_a}, [10, 0, 20])[0], y)


def test_O0_build_gives_the_same_bits(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    inp = _inputs(gen, 40, 6, 12, 2, 50)
    vectorized = _scan(NATIVE, inp, [15, 25])
    monkeypatch.setattr(_build, "build_flags", ("-O0",))
    scalar = _scan(NATIVE, inp, [15, 25])
    assert all(torch.equal(a, b) for a, b in zip(vectorized, scalar))


def _reference(inp, state, dt_limit=(0.0, float("inf"))):
    """The Mamba2 recurrence of one sequence in float64."""
    x, dt, A, B, C, D, bias = (inp[k].double() for k in ("x", "dt", "A", "B", "C", "D", "dt_bias"))
    heads, groups = x.shape[1], B.shape[1]
    h = state.double().clone()
    ys = []
    for t in range(x.shape[0]):
        d = torch.nn.functional.softplus(dt[t] + bias).clamp(*dt_limit)  # [Hs]
        b = B[t].repeat_interleave(heads // groups, 0)  # [Hs, N]
        c = C[t].repeat_interleave(heads // groups, 0)
        h = h * torch.exp(d * A)[:, None, None] + (d[:, None] * b)[:, None, :] * x[t][:, :, None]
        ys.append((h * c[:, None, :]).sum(-1) + D[:, None] * x[t])
    return torch.stack(ys), h


def test_accuracy_against_float64():
    """Tolerance: fp32 state updates over 64 tokens and a 48-term readout of values ~1e1."""
    gen = torch.Generator().manual_seed(3)
    inp = _inputs(gen, 64, 4, 16, 2, 48)
    start = torch.randn(1, 4, 16, 48, generator=gen)
    for limit in ((0.0, float("inf")), (0.01, 0.5)):
        y, state = _scan(NATIVE, inp, [64], start, dt_limit=limit)
        y_ref, state_ref = _reference(inp, start[0], limit)
        native_error = (y.double() - y_ref).abs().max()
        aligned_error = (_scan(ALIGNED, inp, [64], start, dt_limit=limit)[0].double() - y_ref).abs().max()
        print(f"dt_limit {limit}: max abs error native {native_error:.3g}, aligned {aligned_error:.3g}")
        assert native_error < 1e-4 and (state[0].double() - state_ref).abs().max() < 1e-4


def test_gradients_match_float64():
    gen = torch.Generator().manual_seed(4)
    inp = _inputs(gen, 12, 4, 6, 2, 10)
    start = torch.randn(1, 4, 6, 10, generator=gen)
    ours = {k: v.clone().requires_grad_() for k, v in inp.items()}
    state = start.clone().requires_grad_()
    y, final = _scan(NATIVE, ours, [12], state)
    (y.square().sum() + final.sum()).backward()
    ref = {k: v.double().requires_grad_() for k, v in inp.items()}
    state_ref = start[0].double().requires_grad_()
    y_ref, final_ref = _reference(ref, state_ref)
    (y_ref.square().sum() + final_ref.sum()).backward()
    for k in inp:
        assert (ours[k].grad.double() - ref[k].grad).abs().max() < 1e-3 * max(1.0, ref[k].grad.abs().max()), k
    assert (state.grad[0].double() - state_ref.grad).abs().max() < 1e-3


@pytest.mark.parametrize("needs_grad", [("D",), ("C",), ("C", "D"), ("x",), ("state",), ("dt", "A", "B")])
@pytest.mark.parametrize("loss_on", ["y", "state", "both"])
def test_gradients_of_any_subset_of_inputs_equal_the_aligned_ones(needs_grad, loss_on):
    gen = torch.Generator().manual_seed(6)
    inp = _inputs(gen, 6, 2, 3, 1, 4)
    start = torch.randn(1, 2, 3, 4, generator=gen)

    def grads(kernels):
        tensors = {k: v.clone().requires_grad_(k in needs_grad) for k, v in inp.items()}
        state = start.clone().requires_grad_("state" in needs_grad)
        y, final = _scan(kernels, tensors, [6], state)
        loss = {"y": y.square().sum(), "state": final.sum(), "both": y.square().sum() + final.sum()}[loss_on]
        if not loss.requires_grad:  # e.g. the final state does not depend on C or D
            return None
        loss.backward()
        return [t.grad for t in (*tensors.values(), state)]

    native, aligned = grads(NATIVE), grads(ALIGNED)
    if aligned is None:  # native's outputs still carry a grad_fn; its gradients must all be None
        assert native is None or all(g is None for g in native)
        return
    for a, b in zip(native, aligned):
        assert (a is None) == (b is None)
        if a is not None:
            assert (a - b).abs().max() < 1e-4 * max(1.0, b.abs().max())


def test_edge_inputs():
    gen = torch.Generator().manual_seed(5)
    inp = _inputs(gen, 4, 2, 3, 1, 5)
    inp["dt"][1, 0] = float("nan")  # a nan dt reaches the outputs, as in the aligned set
    y, _ = _scan(NATIVE, inp, [4])
    y_aligned, _ = _scan(ALIGNED, inp, [4])
    assert torch.equal(y.isnan(), y_aligned.isnan()) and y[1:, 0].isnan().all()
    # a positive decay exponent up to the fp32 limit stays finite (exp(88.5) ~ 2.7e38)
    big = {**inp, "A": torch.ones(2), "dt": torch.full((4, 2), 88.5), "dt_bias": torch.zeros(2)}
    y_big, _ = _scan(NATIVE, _rows(big, 0, 1), [1])
    assert torch.isfinite(y_big).all()
    # a nan clamp bound gives nan, as torch.clamp does
    assert _scan(NATIVE, inp, [4], dt_limit=(float("nan"), 1.0))[0].isnan().all()
    assert _scan(ALIGNED, inp, [4], dt_limit=(float("nan"), 1.0))[0].isnan().all()
    with pytest.raises(ValueError, match="dt_limit"):
        _scan(NATIVE, inp, [4], dt_limit=(0.0,))
    with pytest.raises(TypeError, match="cu_seqlens"):
        NATIVE.ssm_scan(**inp, cu_seqlens=[0, 4])
    with pytest.raises(ValueError, match="ssm_state must be"):
        _scan(NATIVE, inp, [4], torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="CPU only"):
        _scan(NATIVE, {**inp, "D": inp["D"].to("meta")}, [4])
