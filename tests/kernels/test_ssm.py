"""Mamba2 kernels: causal conv and selective scan give the same bits in one call, in chunks of any
size and one token at a time (aligned), with inverse tests on the default set; accuracy vs float64.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromismatch.kernels import get_kernels

ALIGNED = get_kernels("aligned")
DEFAULT = get_kernels("default")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DT_LIMIT = (1e-3, 1e2)


def _cu(lens: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int64)
    out[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0)
    return out


def _scan_inputs(gen, length: int, heads: int, head_dim: int, groups: int, state: int, dtype):
    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen) * s).to(dtype)

    x, dt = rnd(length, heads, head_dim), rnd(length, heads)
    B, C = rnd(length, groups, state, s=0.5), rnd(length, groups, state, s=0.5)
    params = {
        "A": -torch.rand(heads, generator=gen) * 2 - 0.1,
        "D": torch.randn(heads, generator=gen),
        "dt_bias": torch.randn(heads, generator=gen) - 2.0,
    }
    return x, dt, B, C, params


def _scan(kernels, x, dt, B, C, p, cu, state=None):
    return kernels.ssm_scan(x, dt, p["A"], B, C, p["D"], p["dt_bias"], cu, state, DT_LIMIT)


def _pieces(length: int, cuts: list[int]) -> list[tuple[int, int]]:
    bounds = sorted({0, length, *[c for c in cuts if 0 < c < length]})
    return list(zip(bounds[:-1], bounds[1:]))


scan_shapes = st.fixed_dictionaries(
    {
        "length": st.integers(1, 90),
        "heads": st.sampled_from([2, 4]),
        "head_dim": st.sampled_from([4, 8]),
        "groups": st.sampled_from([1, 2]),
        "state": st.sampled_from([8, 16]),
        "dtype": st.sampled_from(sorted(DTYPES)),
        "seed": st.integers(0, 2**16),
    }
)


@settings(max_examples=30, deadline=None)
@given(shape=scan_shapes, chunk=st.integers(1, 90), data=st.data())
def test_scan_one_call_equals_any_chunking_and_token_by_token(shape, chunk, data):
    gen = torch.Generator().manual_seed(shape["seed"])
    n = shape["length"]
    args = (shape["heads"], shape["head_dim"], shape["groups"], shape["state"], DTYPES[shape["dtype"]])
    x, dt, B, C, p = _scan_inputs(gen, n, *args)
    x2, dt2, B2, C2, _ = _scan_inputs(gen, 7, *args)  # a neighbour sequence
    y_all, h_all = _scan(ALIGNED, x, dt, B, C, p, _cu([n]))
    # packed with a neighbour of another length
    y_pk, h_pk = _scan(
        ALIGNED,
        torch.cat([x2, x]),
        torch.cat([dt2, dt]),
        torch.cat([B2, B]),
        torch.cat([C2, C]),
        p,
        _cu([7, n]),
    )
    assert torch.equal(y_pk[7:], y_all) and torch.equal(h_pk[1], h_all[0])
    # fixed-size chunks, carrying the state
    state, ys = None, []
    for a, b in _pieces(n, list(range(chunk, n, chunk))):
        y, state = _scan(ALIGNED, x[a:b], dt[a:b], B[a:b], C[a:b], p, _cu([b - a]), state)
        ys.append(y)
    assert torch.equal(torch.cat(ys), y_all) and torch.equal(state, h_all)
    # ragged cuts, then the rest one token at a time
    cuts = data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=3), label="cuts")
    state, ys = None, []
    for a, b in _pieces(n, cuts):
        if b - a > 1 and a == 0:
            y, state = _scan(ALIGNED, x[a:b], dt[a:b], B[a:b], C[a:b], p, _cu([b - a]), state)
            ys.append(y)
            continue
        for t in range(a, b):
            y, state = _scan(
                ALIGNED, x[t : t + 1], dt[t : t + 1], B[t : t + 1], C[t : t + 1], p, _cu([1]), state
            )
            ys.append(y)
    assert torch.equal(torch.cat(ys), y_all) and torch.equal(state, h_all)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_batched_decode_step_equals_general_path(dtype):
    """Every sequence with one token takes a shortcut (no padding, grouped views of B and C);
    an empty sequence in the batch sends the same tokens through the general path."""
    gen = torch.Generator().manual_seed(3)
    x, dt, B, C, p = _scan_inputs(gen, 5, 4, 8, 2, 16, DTYPES[dtype])
    state = torch.randn(5, 4, 8, 16, generator=gen)
    y_fast, h_fast = _scan(ALIGNED, x, dt, B, C, p, _cu([1] * 5), state)
    with_empty = torch.cat([state, torch.zeros(1, 4, 8, 16)])
    y_slow, h_slow = _scan(ALIGNED, x, dt, B, C, p, _cu([1] * 5 + [0]), with_empty)
    assert torch.equal(y_fast, y_slow) and torch.equal(h_fast, h_slow[:5])
    xc = torch.randn(5, 24, generator=gen).to(DTYPES[dtype])
    weight, bias = torch.randn(24, 4, generator=gen).to(xc.dtype), torch.randn(24, generator=gen).to(xc.dtype)
    conv_state = torch.randn(5, 24, 3, generator=gen).to(xc.dtype)
    y_fast, s_fast = ALIGNED.causal_conv1d(xc, weight, bias, _cu([1] * 5), conv_state)
    y_slow, s_slow = ALIGNED.causal_conv1d(
        xc, weight, bias, _cu([1] * 5 + [0]), torch.cat([conv_state, torch.zeros(1, 24, 3, dtype=xc.dtype)])
    )
    assert torch.equal(y_fast, y_slow) and torch.equal(s_fast, s_slow[:5])


def test_default_chunked_scan_differs_from_recurrent_decode():
    found = False
    for seed in range(10):
        gen = torch.Generator().manual_seed(seed)
        x, dt, B, C, p = _scan_inputs(gen, 40, 4, 8, 2, 16, torch.float32)
        y_all, _ = _scan(DEFAULT, x, dt, B, C, p, _cu([40]))
        _, state = _scan(DEFAULT, x[:39], dt[:39], B[:39], C[:39], p, _cu([39]))
        y_last, _ = _scan(DEFAULT, x[39:], dt[39:], B[39:], C[39:], p, _cu([1]), state)
        if not torch.equal(y_last[0], y_all[39]):
            found = True
            break
    assert found


conv_shapes = st.fixed_dictionaries(
    {
        "length": st.integers(1, 60),
        "channels": st.sampled_from([8, 24, 40]),
        "width": st.sampled_from([2, 4]),
        "bias": st.booleans(),
        "dtype": st.sampled_from(sorted(DTYPES)),
        "seed": st.integers(0, 2**16),
    }
)


@settings(max_examples=30, deadline=None)
@given(shape=conv_shapes, data=st.data())
def test_conv_split_anywhere_equals_one_call(shape, data):
    gen = torch.Generator().manual_seed(shape["seed"])
    n, ch, dtype = shape["length"], shape["channels"], DTYPES[shape["dtype"]]
    x = torch.randn(n, ch, generator=gen).to(dtype)
    other = torch.randn(5, ch, generator=gen).to(dtype)
    weight = torch.randn(ch, shape["width"], generator=gen).to(dtype)
    bias = torch.randn(ch, generator=gen).to(dtype) if shape["bias"] else None
    y_all, st_all = ALIGNED.causal_conv1d(x, weight, bias, _cu([n]))
    y_pk, st_pk = ALIGNED.causal_conv1d(torch.cat([other, x]), weight, bias, _cu([5, n]))
    assert torch.equal(y_pk[5:], y_all) and torch.equal(st_pk[1], st_all[0])
    cuts = data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=4), label="cuts")
    state, ys = None, []
    for a, b in _pieces(n, cuts):
        y, state = ALIGNED.causal_conv1d(x[a:b], weight, bias, _cu([b - a]), state)
        ys.append(y)
    assert torch.equal(torch.cat(ys), y_all) and torch.equal(state, st_all)
    state, ys = None, []
    for t in range(n):
        y, state = ALIGNED.causal_conv1d(x[t : t + 1], weight, bias, _cu([1]), state)
        ys.append(y)
    assert torch.equal(torch.cat(ys), y_all)


def test_default_conv_decode_differs_from_prefill():
    found = False
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(30, 64, generator=gen)
        weight, bias = torch.randn(64, 4, generator=gen), torch.randn(64, generator=gen)
        y_all, _ = DEFAULT.causal_conv1d(x, weight, bias, _cu([30]))
        _, state = DEFAULT.causal_conv1d(x[:29], weight, bias, _cu([29]))
        y_last, _ = DEFAULT.causal_conv1d(x[29:], weight, bias, _cu([1]), state)
        if not torch.equal(y_last[0], y_all[29]):
            found = True
            break
    assert found


def _scan_reference(x, dt, B, C, p, state=None):
    """float64 recurrence (transformers' selective_state_update, token by token)."""
    heads = x.shape[1]
    rep = heads // B.shape[1]
    h = torch.zeros(heads, x.shape[2], B.shape[2], dtype=torch.float64) if state is None else state.double()
    ys = []
    for t in range(x.shape[0]):
        d = torch.nn.functional.softplus(dt[t].double() + p["dt_bias"].double()).clamp(*DT_LIMIT)
        Bt, Ct = B[t].double().repeat_interleave(rep, 0), C[t].double().repeat_interleave(rep, 0)
        h = (
            torch.exp(d * p["A"].double())[:, None, None] * h
            + (d[:, None] * Bt)[:, None, :] * x[t].double()[..., None]
        )
        ys.append((h * Ct[:, None, :]).sum(-1) + p["D"].double()[:, None] * x[t].double())
    return torch.stack(ys), h


@pytest.mark.parametrize("kernels", [ALIGNED, DEFAULT], ids=["aligned", "default"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_scan_accuracy_against_float64(kernels, dtype):
    """fp32: |err| <= 1e-4 * max|ref| (300 steps of fp32 recurrence / SSD chunks);
    bf16 x (y rounded to bf16 once): |err| <= 2^-8 * max|ref|. State (fp32 either way): 1e-4 * max|ref|."""
    gen = torch.Generator().manual_seed(7)
    x, dt, B, C, p = _scan_inputs(gen, 300, 4, 8, 2, 16, DTYPES[dtype])
    y, h = _scan(kernels, x, dt, B, C, p, _cu([300]))
    y_ref, h_ref = _scan_reference(x, dt, B, C, p)
    tol = 1e-4 if dtype == "fp32" else 2**-8
    assert (y.double() - y_ref).abs().max() <= tol * y_ref.abs().max()
    assert (h[0].double() - h_ref).abs().max() <= 1e-4 * h_ref.abs().max()


@pytest.mark.parametrize("kernels", [ALIGNED, DEFAULT], ids=["aligned", "default"])
def test_conv_accuracy_against_float64(kernels):
    """fp32 |err| <= 1e-5 against float64 conv + silu, with a carried state."""
    gen = torch.Generator().manual_seed(8)
    x, weight, bias = torch.randn(50, 16, generator=gen), torch.randn(16, 4, generator=gen), torch.randn(16)
    state = torch.randn(1, 16, 3, generator=gen)
    y, new_state = kernels.causal_conv1d(x, weight, bias, _cu([50]), state)
    window = torch.cat([state[0].T, x]).double()
    ref = torch.stack([(window[t : t + 4].T * weight.double()).sum(-1) for t in range(50)]) + bias.double()
    ref = ref * torch.sigmoid(ref)
    assert (y.double() - ref).abs().max() <= 1e-5
    assert torch.equal(new_state[0], x[-3:].T)


@pytest.mark.parametrize("kernels", [ALIGNED, DEFAULT], ids=["aligned", "default"])
def test_autograd_path_gives_same_bits_and_gradients(kernels):
    """The trainer differentiates through the scan and conv; with grad on, the aligned scan takes
    an autograd-friendly loop that must reproduce the no-grad bits."""
    gen = torch.Generator().manual_seed(9)
    x, dt, B, C, p = _scan_inputs(gen, 30, 4, 8, 2, 16, torch.float32)
    cu = _cu([12, 18])
    with torch.no_grad():
        y_ref, h_ref = _scan(kernels, x, dt, B, C, p, cu)
    leaves = [t.clone().requires_grad_() for t in (x, dt, B, C)]
    y, h = _scan(kernels, *leaves, p, cu)
    assert torch.equal(y, y_ref) and torch.equal(h, h_ref)
    (y.square().sum() + h.sum()).backward()
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in leaves)
    xc = torch.randn(30, 8, generator=gen, requires_grad=True)
    weight = torch.randn(8, 4, generator=gen, requires_grad=True)
    out, _ = kernels.causal_conv1d(xc, weight, None, cu)
    out.sum().backward()
    assert xc.grad is not None and weight.grad is not None


def test_bad_inputs_raise():
    gen = torch.Generator().manual_seed(0)
    x, dt, B, C, p = _scan_inputs(gen, 5, 4, 8, 3, 16, torch.float32)
    with pytest.raises(ValueError, match="Hs % G"):
        _scan(ALIGNED, x, dt, B, C, p, _cu([5]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        ALIGNED.causal_conv1d(torch.randn(5, 8), torch.randn(8, 4), None, _cu([4]))
    with pytest.raises(ValueError, match="conv_state"):
        ALIGNED.causal_conv1d(torch.randn(5, 8), torch.randn(8, 4), None, _cu([5]), torch.zeros(1, 8, 2))
