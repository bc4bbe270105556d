"""Aligned Mamba2 ops: causal depthwise conv and selective scan, one evaluation order for all phases.

causal_conv1d: each sequence's window is ``[conv_state (W-1 previous inputs), x]``; the output
at t is ``sum_w weight[:, w] * window[t + w]`` accumulated in ascending w in fp32, then
``+ bias``, then silu (``dense.silu``: torch's fused kernel with every element on its vector
path). Only elementwise ops are involved, so a token's
output is the same whether its sequence is run in one call, split at any point (carrying the
returned state), or one token at a time.

ssm_scan: the recurrent order, for every token, in every phase (Mamba2 semantics of
transformers' ``mamba2_selective_state_update`` / ``mamba2_chunk_scan``)::

    dt_t = clamp(softplus(dt_t + dt_bias), dt_limit)
    h_t  = exp(dt_t * A) * h_{t-1} + (dt_t * B_t[group]) (outer) x_t      (heads -> groups in order)
    y_t  = sum_n h_t[..., n] * C_t[group, n] + D * x_t

Why not the chunked SSD algorithm with chunk boundaries fixed at absolute positions: a decode
step would then need the within-chunk history (B, C, x, dt of earlier tokens of the chunk),
which the contract's state ``[S, Hs, P, N]`` does not carry. The recurrence is inherently
sequential in t, but its per-token work is two elementwise ops on the state; everything
that does not depend on h (dt, exp(dt*A), the dt*B*x outer products) is computed for a whole
block of tokens at once, and the readout ``y = h . C`` for all tokens of a block is one
last-dim reduction over N (a fixed length, measured row-count invariant on this CPU). All
sequences of a call advance in lock-step; a sequence that has ended is frozen with
``torch.where`` (its state is never touched again). The state is fp32 in and out; y is
returned in x's dtype. softplus is exp/log based (``torch.nn.functional.softplus`` and
``torch.log1p`` change bits with tensor size on this CPU; exp, log and division do not).
"""

from __future__ import annotations

import torch

from ..capture.allowed_host_reads import host_reads_for_checks
from .dense import silu

#: tokens per block whose h-independent terms (and readout) are computed together; no numeric effect
_TIME_BLOCK = 4


def stable_silu(x: torch.Tensor) -> torch.Tensor:
    """silu with bits independent of the tensor's size (plain ``F.silu`` is not, on this CPU)."""
    return silu(x)


def stable_softplus(x: torch.Tensor) -> torch.Tensor:
    """softplus (threshold 20, as torch) as log1p(exp(x)), log1p(u) = log(1+u) * u / ((1+u) - 1).

    Kept on exact-rounded ops and the position-invariant exp/log rather than ``vector_path``
    around ``F.softplus``: ``dt`` is small ([T, Hs]), so speed is not at stake, and a replayed
    repro (tests/bisect/test_repro.py, ssm-scan-with-state) relies on these bits."""
    u = torch.exp(torch.clamp(x, max=20.0))
    one_plus = 1.0 + u
    denom = one_plus - 1.0
    log1p = torch.where(denom == 0, u, torch.log(one_plus) * (u / torch.where(denom == 0, 1.0, denom)))
    return torch.where(x > 20.0, x, log1p)


def _check_cu(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.is_floating_point():
        raise TypeError(f"cu_seqlens must be an integer tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError("cu_seqlens must be a 1-D offsets tensor [S+1] with S >= 1")
    cu = cu_seqlens.to(torch.int64)
    with host_reads_for_checks():  # (a step graph's replay skips the check)
        offsets = cu.tolist()  # one conversion: a decode step's ops are a few microseconds each
    if offsets[0] != 0 or offsets[-1] != total or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"cu_seqlens must be non-decreasing from 0 to T={total}, got {offsets}")
    return cu


def _pad_by_sequence(x: torch.Tensor, cu: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed [T, ...] -> [S, max_len, ...] (zeros after each end), plus the valid mask [S, max_len]."""
    lens = cu[1:] - cu[:-1]
    steps = torch.arange(max_len, device=x.device)
    valid = steps[None, :] < lens[:, None]
    if x.shape[0] == valid.numel():  # every sequence has max_len tokens: a view, no gather
        return x.view(valid.shape + x.shape[1:]), valid
    idx = torch.where(valid, cu[:-1, None] + steps[None, :], 0)
    padded = x[idx.clamp(max=max(x.shape[0] - 1, 0))] if x.shape[0] else x.new_zeros(idx.shape + x.shape[1:])
    mask = valid.view(valid.shape + (1,) * (x.dim() - 1))
    return torch.where(mask, padded, torch.zeros((), dtype=x.dtype, device=x.device)), valid


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor | None = None,
    activation: str = "silu",
    state_slots: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv over packed sequences (see module docstring)."""
    cu, width = check_conv(
        x, weight, bias, cu_seqlens, conv_state, activation, state_slots, has_initial_state
    )
    return through_slots(
        conv_state,
        state_slots,
        has_initial_state,
        lambda state: _causal_conv1d(x, weight, bias, cu, state, activation),
    )


def _causal_conv1d(x, weight, bias, cu, conv_state, activation) -> tuple[torch.Tensor, torch.Tensor]:
    width = weight.shape[1]
    num_seqs, channels = cu.numel() - 1, x.shape[1]
    lens = cu[1:] - cu[:-1]
    max_len = int(lens.max())
    if conv_state is not None and max_len == 1 and x.shape[0] == num_seqs:
        return _conv_decode_step(x, weight, bias, conv_state, activation)
    state = conv_state if conv_state is not None else x.new_zeros(num_seqs, channels, width - 1)
    padded, _ = _pad_by_sequence(x, cu, max_len)  # [S, L, C]
    window = torch.cat([state.to(x.dtype).transpose(1, 2), padded], dim=1).float()  # [S, W-1+L, C]
    w32 = weight.float()
    acc = window[:, 0:max_len] * w32[:, 0]
    for w in range(1, width):
        acc = acc + window[:, w : w + max_len] * w32[:, w]
    if bias is not None:
        acc = acc + bias.float()
    if activation == "silu":
        acc = stable_silu(acc)
    y = acc.to(x.dtype)
    steps = torch.arange(max_len, device=x.device)
    valid = steps[None, :] < lens[:, None]
    out = y.view(-1, channels) if x.shape[0] == valid.numel() else y[valid]  # packed in sequence order
    # new state: the last W-1 inputs of [state, x] per sequence
    last = lens[:, None] + torch.arange(width - 1, device=x.device)[None, :]  # index into window
    new_state = window.to(x.dtype).gather(1, last[:, :, None].expand(-1, -1, channels)).transpose(1, 2)
    return out, new_state.contiguous()


def _conv_decode_step(x, weight, bias, conv_state, activation) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`causal_conv1d` when every sequence has exactly one token: the same elementwise ops
    in the same order on the same values (so the same bits), without the padding, the packing
    gather and the state gather that ragged lengths need."""
    width = weight.shape[1]
    window = torch.cat([conv_state.to(x.dtype).transpose(1, 2), x[:, None]], dim=1).float()  # [S, W, C]
    w32 = weight.float()
    acc = window[:, 0:1] * w32[:, 0]
    for w in range(1, width):
        acc = acc + window[:, w : w + 1] * w32[:, w]
    if bias is not None:
        acc = acc + bias.float()
    if activation == "silu":
        acc = stable_silu(acc)
    new_state = window[:, 1:].to(x.dtype).transpose(1, 2).contiguous()
    return acc.to(x.dtype).view(x.shape), new_state


def check_state_slots(store, state_slots, has_initial_state, num_seqs: int, name: str) -> None:
    """With ``state_slots``, ``store`` holds one state per slot ``[N, ...]`` (the engine's cache):
    sequence s starts from ``store[state_slots[s]]``, or from zeros where ``has_initial_state[s]`` is
    False (None: every sequence has one), and its final state is written back to that row in place.
    Without, ``store`` is the sequences' states ``[S, ...]``, which the op does not modify."""
    if state_slots is None:
        if has_initial_state is not None:
            raise ValueError("has_initial_state needs state_slots (it marks rows of a per-slot store)")
        return
    if store is None:
        raise ValueError(f"state_slots needs {name}: the per-slot store they index")
    if (
        not isinstance(state_slots, torch.Tensor)
        or state_slots.dtype != torch.int64
        or state_slots.shape != (num_seqs,)
    ):
        got = (
            tuple(state_slots.shape) if isinstance(state_slots, torch.Tensor) else type(state_slots).__name__
        )
        raise ValueError(f"state_slots must be an int64 tensor [S={num_seqs}], got {got}")
    if has_initial_state is not None and (
        not isinstance(has_initial_state, torch.Tensor)
        or has_initial_state.dtype != torch.bool
        or has_initial_state.shape != (num_seqs,)
    ):
        raise ValueError(f"has_initial_state must be a bool tensor [S={num_seqs}]")
    with host_reads_for_checks():  # (a step graph's replay skips the check: the engine builds the slots)
        slots = state_slots.tolist()
    outside = [slot for slot in slots if not 0 <= slot < store.shape[0]]
    if outside:
        raise ValueError(f"state_slots hold {outside[0]}, outside {name}'s slots 0..{store.shape[0] - 1}")
    if len(set(slots)) != len(slots):
        raise ValueError(f"state_slots must be distinct (each sequence writes its own row), got {slots}")
    if torch.is_grad_enabled():
        # (an op that wrote its store cannot be differentiated or recomputed for a backward: the store
        # already holds the final states)
        raise ValueError(f"state_slots update {name} in place, which autograd cannot record: use no_grad")


def updatable_in_place(store: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a native kernel can read and write ``store``'s rows by address as ``dtype`` values: that
    dtype, contiguous, and its bytes its values (not a lazily negated or conjugated view). Other
    stores go through ``through_slots``."""
    return store.dtype == dtype and store.is_contiguous() and not (store.is_neg() or store.is_conj())


def through_slots(store, state_slots, has_initial_state, run):
    """``run(initial states)`` -> (y, final states); with ``state_slots`` the initial states are the
    store's rows (``initial_states``) and the final states go back to those rows in place, and the
    store is returned in their place (the per-slot contract of ``KernelSet.causal_conv1d``)."""
    if state_slots is None:
        return run(store)
    y, final_states = run(initial_states(store, state_slots, has_initial_state))
    store.index_copy_(0, state_slots, final_states.to(store.dtype))
    return y, store


def initial_states(store, state_slots, has_initial_state):
    """The sequences' initial states (``check_state_slots`` says what the arguments are): a gather of
    their slots, zeros where a sequence has none."""
    if state_slots is None:
        return store
    states = store[state_slots]
    if has_initial_state is None:
        return states
    return states.masked_fill(~has_initial_state.view(-1, *(1,) * (states.dim() - 1)), 0)


def check_conv(
    x, weight, bias, cu_seqlens, conv_state, activation, state_slots=None, has_initial_state=None
) -> tuple[torch.Tensor, int]:
    if activation not in ("silu", None, "identity"):
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"x must be [T, C] and weight [C, W]; got {tuple(x.shape)}, {tuple(weight.shape)}")
    width = weight.shape[1]
    if width < 2:
        raise ValueError(f"conv width must be >= 2, got {width}")
    if bias is not None and bias.shape != (x.shape[1],):
        raise ValueError(f"bias must be [C={x.shape[1]}], got {tuple(bias.shape)}")
    cu = _check_cu(cu_seqlens, x.shape[0])
    check_state_slots(conv_state, state_slots, has_initial_state, cu.numel() - 1, "conv_state")
    if conv_state is not None:
        rows, what = (cu.numel() - 1, "S") if state_slots is None else (conv_state.shape[0], "slots")
        if conv_state.shape != (rows, x.shape[1], width - 1):
            raise ValueError(f"conv_state must be [{what}, C, W-1], got {tuple(conv_state.shape)}")
    return cu, width


def check_scan(x, dt, A, B, C, D, dt_bias, cu_seqlens, ssm_state, state_slots=None, has_initial_state=None):
    if x.dim() != 3:
        raise ValueError(f"x must be [T, Hs, P], got {tuple(x.shape)}")
    total, heads, head_dim = x.shape
    if dt.shape != (total, heads):
        raise ValueError(f"dt must be [T, Hs] = {(total, heads)}, got {tuple(dt.shape)}")
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        if t.shape != (heads,):
            raise ValueError(f"{name} must be [Hs={heads}], got {tuple(t.shape)}")
    groups_ok = B.dim() == 3 and B.shape[1] > 0 and heads % B.shape[1] == 0
    if not groups_ok or B.shape != C.shape or B.shape[0] != total:
        raise ValueError(
            f"B and C must be [T, G, N] with Hs % G == 0; got {tuple(B.shape)}, {tuple(C.shape)}"
        )
    cu = _check_cu(cu_seqlens, total)
    check_state_slots(ssm_state, state_slots, has_initial_state, cu.numel() - 1, "ssm_state")
    if ssm_state is not None:
        rows, what = (cu.numel() - 1, "S") if state_slots is None else (ssm_state.shape[0], "slots")
        if ssm_state.shape != (rows, heads, head_dim, B.shape[2]):
            raise ValueError(f"ssm_state must be [{what}, Hs, P, N], got {tuple(ssm_state.shape)}")
    return cu


def check_dt_limit(dt_limit) -> None:
    if not isinstance(dt_limit, tuple | list) or len(dt_limit) != 2:
        raise ValueError(f"dt_limit must be a (low, high) pair, got {dt_limit!r}")


def ssm_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
    ssm_state: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    state_slots: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba2 selective scan in recurrent order (see module docstring)."""
    cu = check_scan(x, dt, A, B, C, D, dt_bias, cu_seqlens, ssm_state, state_slots, has_initial_state)
    check_dt_limit(dt_limit)
    return through_slots(
        ssm_state,
        state_slots,
        has_initial_state,
        lambda state: _ssm_scan(x, dt, A, B, C, D, dt_bias, cu, state, dt_limit),
    )


def _ssm_scan(x, dt, A, B, C, D, dt_bias, cu, ssm_state, dt_limit) -> tuple[torch.Tensor, torch.Tensor]:
    num_seqs = cu.numel() - 1
    _, heads, head_dim = x.shape
    groups, state_size = B.shape[1], B.shape[2]
    lens = cu[1:] - cu[:-1]
    max_len = int(lens.max())
    if ssm_state is not None and max_len == 1 and x.shape[0] == num_seqs:
        return _scan_decode_step(x, dt, A, B, C, D, dt_bias, ssm_state, dt_limit)
    state = (
        ssm_state.float().clone()
        if ssm_state is not None
        else torch.zeros(num_seqs, heads, head_dim, state_size, dtype=torch.float32, device=x.device)
    )
    x_p, valid = _pad_by_sequence(x.float(), cu, max_len)  # [S, L, Hs, P]
    dt_p, _ = _pad_by_sequence(dt.float(), cu, max_len)
    rep = heads // groups
    B_p = _pad_by_sequence(B.float(), cu, max_len)[0].repeat_interleave(rep, dim=2)  # [S, L, Hs, N]
    C_p = _pad_by_sequence(C.float(), cu, max_len)[0].repeat_interleave(rep, dim=2)
    dt_p = stable_softplus(dt_p + dt_bias.float())
    dt_p = torch.clamp(dt_p, min=dt_limit[0], max=dt_limit[1])
    decay = torch.exp(dt_p * A.float())  # [S, L, Hs]
    y_p = torch.empty(num_seqs, max_len, heads, head_dim, dtype=torch.float32, device=x.device)
    ragged = bool((lens != max_len).any())
    track_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, dt, A, B, C, D, dt_bias, ssm_state)
    )
    for t0 in range(0, max_len, _TIME_BLOCK):
        t1 = min(max_len, t0 + _TIME_BLOCK)
        dB = dt_p[:, t0:t1, :, None] * B_p[:, t0:t1]  # [S, l, Hs, N]
        dBx = dB[:, :, :, None, :] * x_p[:, t0:t1, :, :, None]  # [S, l, Hs, P, N]
        decay_blk = decay[:, t0:t1, :, None, None]
        if track_grad:  # autograd cannot record out= ops: same two ops, new tensors
            steps = []
            for t in range(t1 - t0):
                new_state = state * decay_blk[:, t] + dBx[:, t]
                if ragged:
                    new_state = torch.where(valid[:, t0 + t, None, None, None], new_state, state)
                steps.append(new_state)
                state = new_state
            states = torch.stack(steps, dim=1)
        else:
            states = torch.empty_like(dBx)
            for t in range(t1 - t0):
                step = states[:, t]
                torch.mul(state, decay_blk[:, t], out=step)  # two separate roundings, as in a decode step
                step.add_(dBx[:, t])
                if ragged:
                    step.copy_(torch.where(valid[:, t0 + t, None, None, None], step, state))
                state = step
        y_p[:, t0:t1] = (states * C_p[:, t0:t1, :, None, :]).sum(-1) + D.float()[:, None] * x_p[:, t0:t1]
    y = y_p.view(-1, heads, head_dim) if not ragged else y_p[valid]
    return y.to(x.dtype), state.clone()


def _scan_decode_step(x, dt, A, B, C, D, dt_bias, ssm_state, dt_limit) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ssm_scan` when every sequence has exactly one token: one recurrent step with the
    same ops in the same order on the same values (so the same bits), without the padding, the
    time blocks and the state copies. Heads are addressed as [groups, heads per group] views
    instead of repeating B and C per head: the products are of the same two numbers, and the
    readout sums the same contiguous N values per row."""
    num_seqs, heads, head_dim = x.shape
    groups, state_size = B.shape[1], B.shape[2]
    rep = heads // groups
    x32 = x.float()
    dt1 = torch.clamp(stable_softplus(dt.float() + dt_bias.float()), min=dt_limit[0], max=dt_limit[1])
    decay = torch.exp(dt1 * A.float())  # [S, Hs]
    d_b = (dt1.view(num_seqs, groups, rep, 1) * B.float().view(num_seqs, groups, 1, state_size)).view(
        num_seqs, heads, 1, state_size
    )
    state = ssm_state.float() * decay[:, :, None, None]  # two separate roundings, as in ssm_scan
    state = state.add_(d_b * x32[:, :, :, None])  # [S, Hs, P, N]
    readout = state.view(num_seqs, groups, rep, head_dim, state_size) * C.float().view(
        num_seqs, groups, 1, 1, state_size
    )
    y = readout.sum(-1).view(num_seqs, heads, head_dim) + D.float()[:, None] * x32
    return y.to(x.dtype), state
