"""Kernel invariance self-check: run a KernelSet's bitwise promises on *your* machine and device.

The aligned set's invariances are empirical facts about one library build on one processor
(docs/parity.md): which GEMM kernel MKL, oneDNN or cuBLAS picks for a shape is not a documented
contract. This module re-measures them wherever it runs, for any registered set, on any torch
device, so a user can see on their own CPU or GPU which promises hold before trusting a logprob:

    zm invariance --kernels aligned --device cuda --json

Each check computes the same numbers two ways that the aligned contract says must give
identical bits and reports ``torch.equal`` over all compared pairs (``identical``) and the
largest absolute difference over finite entries (``max_abs_diff``; ``inf`` when the non-finite
entries differ, e.g. a nan on one side). Inputs are drawn on the CPU from a seeded generator and
then moved to the device, so every device sees the same numbers. The checks (fixed, tiny-model shapes):

- ``linear/rows``: a row's output alone, in a sub-batch at an offset, and in the full batch;
- ``linear/column_split``: the output columns computed from 2 and 4 column slices of the weight
  (column-parallel layout) vs the whole weight;
- ``row_parallel_linear/rows``: the virtual-shard row-parallel linear (TP 1), rows as above;
- ``rms_norm/rows``, ``logprobs/rows`` (fp32 head, raw and processed logprobs),
  ``quant_linear/rows`` (fp8 per channel, fp8 blocks, nvfp4);
- ``attention/phase``: each query's output in a packed full prefill vs a paged chunked prefill
  (chunk 7) and paged decode (chunk 1), with other sequences sharing every call and the cache
  blocks in shuffled order;
- ``moe/neighbours``: a token routed and computed alone vs among other tokens;
- ``ssm/chunking``: the Mamba2 conv and scan in one call vs chunks of 5 vs one token at a time.

Guard: a set with ``promises_invariance`` (the aligned set) is re-measured by
``verify_invariance`` once per process, device, dtype and torch thread count, when an engine
(``LLM``) or the trainer's recompute (``compute_logprobs``) starts on it: about 0.5 s per dtype
on the CI CPU. ``ZEROMISMATCH_SELFCHECK`` chooses what a broken promise does: ``warn`` (default,
a ``KernelInvarianceWarning`` naming the checks), ``error`` (raise ``KernelInvarianceError``) or
``off``. Measured why it exists: on an Intel Xeon (AMX) with torch 2.11 / oneDNN 3.10.2 the
aligned fp32 linear was not row-invariant, and on an H200 the aligned GEMMs and attention were
not either (docs/parity.md, "Portability").

The tensor-parallel degrees 2 and 4 of the row-parallel linear need a process group and are
tested in tests/kernels/test_tensor_parallel.py, not here. This is a report, not a test: the
default set is expected to break some checks (that is what makes it the contrast), and
tests/kernels/test_selfcheck.py pins what holds on the CPU this project's CI runs on.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from .aligned.gemm import gemm_tile_rows
from .base import KernelSet
from .quant import quantize_fp8, quantize_nvfp4

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class CheckResult:
    op: str
    prop: str
    dtype: str
    identical: bool
    max_abs_diff: float
    comparisons: int

    def as_dict(self) -> dict:
        return asdict(self)


class _Tally:
    """Accumulates ``torch.equal`` and the largest |a - b| over compared tensor pairs."""

    def __init__(self) -> None:
        self.identical, self.max_abs_diff, self.comparisons = True, 0.0, 0

    def compare(self, a: torch.Tensor, b: torch.Tensor) -> None:
        if a.shape != b.shape:
            raise AssertionError(f"compared tensors differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
        self.comparisons += 1
        if not torch.equal(a, b):
            self.identical = False
            finite = torch.isfinite(a) & torch.isfinite(b)
            diff = (a.double() - b.double()).abs()[finite]
            both_inf_equal = torch.equal(a[~finite], b[~finite])
            worst = float(diff.max()) if diff.numel() else 0.0
            self.max_abs_diff = max(self.max_abs_diff, worst if both_inf_equal else float("inf"))


class _Inputs:
    """Seeded CPU draws moved to ``device``: the same numbers on every device."""

    def __init__(self, seed: int, device: torch.device, dtype: torch.dtype):
        self.gen = torch.Generator().manual_seed(seed)
        self.device, self.dtype = device, dtype

    def randn(self, *shape, scale: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        values = torch.randn(*shape, generator=self.gen) * scale
        return values.to(dtype or self.dtype).to(self.device)

    def rand(self, *shape) -> torch.Tensor:
        return torch.rand(*shape, generator=self.gen).to(self.device)

    def cu(self, lens: list[int]) -> torch.Tensor:
        out = torch.zeros(len(lens) + 1, dtype=torch.int64)
        out[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0)
        return out.to(self.device)


def _row_checks(tally: _Tally, fn: Callable[[slice], torch.Tensor], rows: int) -> None:
    """Row i of ``fn(all rows)`` == row i of ``fn`` on a single row and on a 5-row window at an offset."""
    full = fn(slice(0, rows))
    for i in sorted({0, 1, rows // 2, rows - 1}):
        tally.compare(fn(slice(i, i + 1))[0], full[i])
        lo = max(0, min(i - 2, rows - 5))
        tally.compare(fn(slice(lo, lo + 5))[i - lo], full[i])


_GEMM_SHAPES = ((256, 256), (1024, 1024), (1024, 3072))
_ROWS = 67


def _linear_rows(ks: KernelSet, inp: _Inputs, tally: _Tally) -> None:
    for k, n in _GEMM_SHAPES:
        x, w = inp.randn(_ROWS, k), inp.randn(n, k, scale=k**-0.5)
        _row_checks(tally, lambda s, x=x, w=w: ks.linear(x[s], w), _ROWS)


def _linear_column_split(ks: KernelSet, inp: _Inputs, tally: _Tally) -> None:
    for k, n in _GEMM_SHAPES:
        x, w = inp.randn(_ROWS, k), inp.randn(n, k, scale=k**-0.5)
        whole = ks.linear(x, w)
        for pieces in (2, 4):
            tally.compare(torch.cat([ks.linear(x, part) for part in w.chunk(pieces)], dim=-1), whole)


def _row_parallel_rows(ks: KernelSet, inp: _Inputs, tally: _Tally) -> None:
    for k, n in _GEMM_SHAPES[:2]:
        x, w = inp.randn(_ROWS, k), inp.randn(n, k, scale=k**-0.5)
        _row_checks(tally, lambda s, x=x, w=w: ks.row_parallel_linear(x[s], w), _ROWS)


def _rms_norm_rows(ks: KernelSet, inp: _Inputs, tally: _Tally) -> None:
    for h in (256, 1024):
        x, w = inp.randn(_ROWS, h), 1.0 + inp.randn(h, scale=0.1)
        _row_checks(tally, lambda s, x=x, w=w: ks.rms_norm(x[s], w, 1e-6), _ROWS)


def _logprobs_rows(ks: KernelSet, inp: _Inputs, tally: _Tally) -> None:
    hidden, vocab = 256, 4096
    x, w = inp.randn(_ROWS, hidden), inp.randn(vocab, hidden, scale=hidden**-0.5)
    temperature = (0.5 + inp.rand(_ROWS)).float()
    top_k = torch.tensor([0, 50] * (_ROWS // 2) + [7], dtype=torch.int64).to(inp.device)
    top_p = torch.where(inp.rand(_ROWS) < 0.5, 1.0, 0.9).float()

    def raw(s):
        return ks.log_softmax(ks.lm_head(x[s], w))

    def processed(s):
        return ks.processed_log_softmax(ks.lm_head(x[s], w), temperature[s], top_k[s], top_p[s])

    _row_checks(tally, raw, _ROWS)
    _row_checks(tally, processed, _ROWS)


def _quant_linear_rows(ks: KernelSet, inp: _Inputs, tally: _Tally) -> None:
    k = n = 1024
    weight = inp.randn(n, k, scale=k**-0.5, dtype=torch.float32)
    x = inp.randn(_ROWS, k)
    for qweight in (quantize_fp8(weight), quantize_fp8(weight, block=(128, 128)), quantize_nvfp4(weight)):
        _row_checks(tally, lambda s, q=qweight: ks.quant_linear(x[s], q), _ROWS)


def _attention_phase(ks: KernelSet, inp: _Inputs, tally: _Tally) -> None:
    hq, hkv, dim, block = 8, 2, 64, 16
    lengths = [37, 130, 5]
    qs = [inp.randn(n, hq, dim) for n in lengths]
    ks_ = [inp.randn(n, hkv, dim) for n in lengths]
    vs = [inp.randn(n, hkv, dim) for n in lengths]
    scale = dim**-0.5
    cu = inp.cu(lengths)
    full = ks.attention(torch.cat(qs), torch.cat(ks_), torch.cat(vs), cu, cu, scale)
    full_per_seq = full.split(lengths)

    # paged cache: each sequence's blocks at shuffled physical indices; unused slots hold garbage
    max_blocks = max(-(-n // block) for n in lengths)
    num_blocks = len(lengths) * max_blocks
    order = torch.randperm(num_blocks, generator=inp.gen)
    table = order.view(len(lengths), max_blocks)
    k_cache = inp.randn(num_blocks, block, hkv, dim, scale=100.0)
    v_cache = inp.randn(num_blocks, block, hkv, dim, scale=100.0)
    for s, n in enumerate(lengths):
        for pos in range(n):
            slot = int(table[s, pos // block])
            k_cache[slot, pos % block] = ks_[s][pos]
            v_cache[slot, pos % block] = vs[s][pos]
    table = table.to(inp.device)

    for chunk in (7, 1):
        outputs: list[list[torch.Tensor]] = [[] for _ in lengths]
        done = [0] * len(lengths)
        # every step advances every unfinished sequence by one chunk, in one shared call
        while any(d < n for d, n in zip(done, lengths)):
            active = [s for s, n in enumerate(lengths) if done[s] < n]
            q_parts, ends = [], []
            for s in active:
                end = min(lengths[s], done[s] + chunk)
                q_parts.append(qs[s][done[s] : end])
                ends.append(end)
            cu_q = inp.cu([p.shape[0] for p in q_parts])
            kv_lens = torch.tensor(ends, dtype=torch.int64).to(inp.device)
            out = ks.paged_attention(
                torch.cat(q_parts), k_cache, v_cache, table[active], cu_q, kv_lens, scale
            )
            for s, part in zip(active, out.split([p.shape[0] for p in q_parts])):
                outputs[s].append(part)
            for s, end in zip(active, ends):
                done[s] = end
        for s in range(len(lengths)):
            tally.compare(torch.cat(outputs[s]), full_per_seq[s])


def _moe_neighbours(ks: KernelSet, inp: _Inputs, tally: _Tally) -> None:
    tokens, experts, top_k, hidden, inter = 24, 8, 2, 256, 128
    x = inp.randn(tokens, hidden)
    router = inp.randn(experts, hidden, scale=hidden**-0.5)
    w_gate = inp.randn(experts, inter, hidden, scale=hidden**-0.5)
    w_up = inp.randn(experts, inter, hidden, scale=hidden**-0.5)
    w_down = inp.randn(experts, hidden, inter, scale=inter**-0.5)

    def moe(s):
        weights, ids = ks.moe_route(ks.linear(x[s], router), top_k)
        return ks.moe_experts(x[s], weights, ids, w_gate, w_up, w_down)

    _row_checks(tally, moe, tokens)


def _ssm_chunking(ks: KernelSet, inp: _Inputs, tally: _Tally) -> None:
    length, heads, head_dim, groups, state, width = 45, 8, 32, 2, 64, 4
    channels = heads * head_dim
    xc = inp.randn(length, channels)
    conv_w, conv_b = inp.randn(channels, width, scale=0.5), inp.randn(channels, scale=0.1)
    x, dt = inp.randn(length, heads, head_dim), inp.randn(length, heads)
    B, C = inp.randn(length, groups, state, scale=0.5), inp.randn(length, groups, state, scale=0.5)
    A = -(inp.rand(heads) * 2 + 0.1).float()
    D, dt_bias = inp.randn(heads, dtype=torch.float32), inp.randn(heads, dtype=torch.float32) - 2.0
    limit = (1e-3, 1e2)
    y_conv, conv_state = ks.causal_conv1d(xc, conv_w, conv_b, inp.cu([length]))
    y_scan, scan_state = ks.ssm_scan(x, dt, A, B, C, D, dt_bias, inp.cu([length]), None, limit)
    for chunk in (5, 1):
        conv_parts, scan_parts, cstate, sstate = [], [], None, None
        for a in range(0, length, chunk):
            b = min(length, a + chunk)
            y, cstate = ks.causal_conv1d(xc[a:b], conv_w, conv_b, inp.cu([b - a]), cstate)
            conv_parts.append(y)
            y, sstate = ks.ssm_scan(
                x[a:b], dt[a:b], A, B[a:b], C[a:b], D, dt_bias, inp.cu([b - a]), sstate, limit
            )
            scan_parts.append(y)
        tally.compare(torch.cat(conv_parts), y_conv)
        tally.compare(cstate, conv_state)
        tally.compare(torch.cat(scan_parts), y_scan)
        tally.compare(sstate, scan_state)


#: (op, property) -> check; the order is the report's
CHECKS: dict[tuple[str, str], Callable[[KernelSet, _Inputs, _Tally], None]] = {
    ("linear", "rows"): _linear_rows,
    ("linear", "column_split"): _linear_column_split,
    ("row_parallel_linear", "rows"): _row_parallel_rows,
    ("rms_norm", "rows"): _rms_norm_rows,
    ("logprobs", "rows"): _logprobs_rows,
    ("quant_linear", "rows"): _quant_linear_rows,
    ("attention", "phase"): _attention_phase,
    ("moe", "neighbours"): _moe_neighbours,
    ("ssm", "chunking"): _ssm_chunking,
}


# check ``index`` of run seed ``seed`` draws its inputs from generator seed seed * SEED_STRIDE + index
SEED_STRIDE = 1000
if len(CHECKS) >= SEED_STRIDE:  # two checks of neighbouring run seeds would share inputs
    raise RuntimeError(f"{len(CHECKS)} checks need SEED_STRIDE > {SEED_STRIDE}")
SEED_LIMIT = 2**63 // SEED_STRIDE  # seeds in [0, SEED_LIMIT) keep every generator seed within int64


def check_names() -> list[str]:
    return [op for op, _ in CHECKS]


def run_checks(
    kernels: KernelSet,
    device: str | torch.device = "cpu",
    dtypes: tuple[str, ...] = ("fp32", "bf16"),
    seed: int = 0,
    only: tuple[str, ...] = (),
    progress: Callable[[str], None] | None = None,
) -> list[CheckResult]:
    """Run every check (or those whose op is in ``only``) for each dtype; see the module docstring."""
    device = torch.device(device)
    if not dtypes:
        raise ValueError(f"no dtype given: choose at least one of {sorted(DTYPES)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be an int in [0, {SEED_LIMIT}), got {seed!r}")
    unknown = sorted(set(dtypes) - set(DTYPES))
    if unknown:
        raise ValueError(f"unknown dtype(s) {unknown}; choose from {sorted(DTYPES)}")
    bad_ops = sorted(set(only) - set(check_names()))
    if bad_ops:
        raise ValueError(f"unknown check(s) {bad_ops}; choose from {list(dict.fromkeys(check_names()))}")
    results = []
    with torch.inference_mode():
        for dtype in dtypes:
            for index, ((op, prop), check) in enumerate(CHECKS.items()):
                if only and op not in only:
                    continue
                if progress is not None:
                    progress(f"{op}/{prop} {dtype}")
                tally = _Tally()
                check(kernels, _Inputs(seed * SEED_STRIDE + index, device, DTYPES[dtype]), tally)
                results.append(
                    CheckResult(op, prop, dtype, tally.identical, tally.max_abs_diff, tally.comparisons)
                )
    return results


class KernelInvarianceWarning(RuntimeWarning):
    """A kernel set that promises invariance broke a check on this machine (logprobs may drift)."""


class KernelInvarianceError(RuntimeError):
    """Raised instead of the warning when ``ZEROMISMATCH_SELFCHECK=error``."""


_SELFCHECK_MODES = ("warn", "error", "off")
_verified: dict[tuple, list[CheckResult]] = {}


def verify_invariance(
    kernels: KernelSet, device: str | torch.device, dtype: torch.dtype
) -> list[CheckResult]:
    """Re-measure a promising set's invariances here (cached per process, device, dtype, threads).

    Returns the failing checks (empty when all hold, when the set promises nothing, or when
    ``ZEROMISMATCH_SELFCHECK=off``); warns or raises on failure, see the module docstring."""
    mode = os.environ.get("ZEROMISMATCH_SELFCHECK", "warn").strip().lower() or "warn"
    if mode not in _SELFCHECK_MODES:
        raise ValueError(f"ZEROMISMATCH_SELFCHECK must be one of {_SELFCHECK_MODES}, got {mode!r}")
    if mode == "off" or not getattr(kernels, "promises_invariance", False):
        return []
    names = {value: key for key, value in DTYPES.items()}
    if dtype not in names:  # fp64 / fp16 models: the checks cover fp32 and bf16 only
        return []
    device = torch.device(device)
    key = (type(kernels), kernels.name, str(device), dtype, torch.get_num_threads(), gemm_tile_rows())
    if key not in _verified:
        results = run_checks(kernels, device, (names[dtype],))
        _verified[key] = [r for r in results if not r.identical]
    failing = _verified[key]
    if failing:
        listed = ", ".join(f"{r.op}/{r.prop} (max |diff| {r.max_abs_diff:.3g})" for r in failing)
        message = (
            f"kernel set {kernels.name!r} promises bitwise invariance, but on {device} in {names[dtype]} "
            f"with {torch.get_num_threads()} torch threads these checks differ: {listed}. Engine and trainer "
            f"logprobs will not be bitwise equal here; `zm invariance --kernels {kernels.name} --device "
            f"{device}` shows the details (ZEROMISMATCH_SELFCHECK=off|warn|error)."
        )
        if not gemm_tile_rows():
            message += (
                " The portable GEMM mode (ZEROMISMATCH_GEMM_TILE_ROWS=8: every GEMM call gets 8 rows) "
                "restored the row and phase checks on the machines measured in docs/parity.md."
            )
        if mode == "error":
            raise KernelInvarianceError(message)
        warnings.warn(message, KernelInvarianceWarning, stacklevel=3)
    return failing


def verify_for_model(kernels: KernelSet, model: torch.nn.Module) -> list[CheckResult]:
    """``verify_invariance`` on the device and activation dtype a model runs in (its first
    floating parameter's device; ``model.dtype`` when it has one, else that parameter's dtype)."""
    params = model.parameters() if isinstance(model, torch.nn.Module) else ()
    param = next((p for p in params if p.is_floating_point()), None)
    if param is None:  # not a torch module (a test double, a remote handle): nothing to measure on
        return []
    return verify_invariance(kernels, param.device, getattr(model, "dtype", param.dtype))
