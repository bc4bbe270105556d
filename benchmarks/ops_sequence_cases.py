"""Benchmark cases for the sequence ops (attention, MoE, Mamba2), aligned vs default.

The attention and SSM-scan cases appear twice when a C compiler is available: ``attention_*``
/ ``ssm_scan_*`` with the pure-torch aligned set and ``*_native`` with the aligned-native set
(kernels/native) in the "aligned" column, each against the same default op.

``CASES`` follows ``benchmarks/timing.py``'s ``OpCase`` format; ``benchmarks/ops.py`` runs them.
Run alone: ``python benchmarks/ops_sequence_cases.py [--quick] [--cpu-time] [--only REGEX]``.
Shapes are tiny-model sized (the CPU reference scale): 8 query heads, 2 KV heads, head dim 64;
MoE hidden 256 / expert width 128; Mamba2 8 heads x 32 head dim, state 64, 2 groups.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import OpCase, Timing, format_table, measure, summarize  # noqa: E402

from zeromismatch.audit.benchmarks import NATIVE_SUFFIX  # noqa: E402  (the report reads these names)
from zeromismatch.kernels import get_kernels  # noqa: E402

ALIGNED = get_kernels("aligned")
DEFAULT = get_kernels("default")
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}
HQ, HKV, HEAD_DIM = 8, 2, 64
CACHE_BLOCK = 16


def _cu(lens: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int64)
    out[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0)
    return out


#: why the aligned-native rows are missing (the build error), or None when they run
NATIVE_NOT_RUN: str | None = None


def _native_set():
    """The aligned-native set (kernels/native) when it builds here, else None (the reason is kept in
    ``NATIVE_NOT_RUN`` and printed, so a missing row never goes unexplained)."""
    global NATIVE_NOT_RUN
    from zeromismatch.kernels.native import unavailable_reason

    NATIVE_NOT_RUN = unavailable_reason()
    if NATIVE_NOT_RUN:
        print(f"ops: aligned-native rows not run: {NATIVE_NOT_RUN}", file=sys.stderr)
        return None
    return get_kernels("aligned-native")


def _prefill_case(seq_len: int, dtype, aligned=ALIGNED, name="attention_prefill") -> OpCase:
    def make():
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(seq_len, HQ, HEAD_DIM, generator=gen).to(dtype)
        k = torch.randn(seq_len, HKV, HEAD_DIM, generator=gen).to(dtype)
        v = torch.randn(seq_len, HKV, HEAD_DIM, generator=gen).to(dtype)
        return q, k, v, _cu([seq_len]), _cu([seq_len]), HEAD_DIM**-0.5

    return OpCase(
        name,
        f"L={seq_len} Hq={HQ} Hkv={HKV} D={HEAD_DIM} {DTYPE_NAMES[dtype]}",
        make,
        lambda a: aligned.attention(*a),
        lambda a: DEFAULT.attention(*a),
    )


def _decode_case(batch: int, context: int, dtype, aligned=ALIGNED, name="attention_decode") -> OpCase:
    def make():
        gen = torch.Generator().manual_seed(1)
        blocks_per_seq = -(-context // CACHE_BLOCK)
        num_blocks = batch * blocks_per_seq
        k_cache = torch.randn(num_blocks, CACHE_BLOCK, HKV, HEAD_DIM, generator=gen).to(dtype)
        v_cache = torch.randn(num_blocks, CACHE_BLOCK, HKV, HEAD_DIM, generator=gen).to(dtype)
        table = torch.randperm(num_blocks, generator=gen).view(batch, blocks_per_seq)
        q = torch.randn(batch, HQ, HEAD_DIM, generator=gen).to(dtype)
        # contexts spread over (context/2, context] so the batch is ragged, as in an engine
        kv_lens = context - torch.randint(0, max(1, context // 2), (batch,), generator=gen)
        return q, k_cache, v_cache, table, _cu([1] * batch), kv_lens, HEAD_DIM**-0.5

    return OpCase(
        name,
        f"B={batch} ctx<={context} block={CACHE_BLOCK} {DTYPE_NAMES[dtype]}",
        make,
        lambda a: aligned.paged_attention(*a),
        lambda a: DEFAULT.paged_attention(*a),
    )


def _moe_case(tokens: int, experts: int, top_k: int, dtype, hidden: int = 256, inter: int = 128) -> OpCase:
    def make():
        gen = torch.Generator().manual_seed(2)
        x = torch.randn(tokens, hidden, generator=gen).to(dtype)
        logits = torch.randn(tokens, experts, generator=gen)
        w_gate = (torch.randn(experts, inter, hidden, generator=gen) * hidden**-0.5).to(dtype)
        w_up = (torch.randn(experts, inter, hidden, generator=gen) * hidden**-0.5).to(dtype)
        w_down = (torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5).to(dtype)
        return x, logits, top_k, w_gate, w_up, w_down

    def run(kernels):
        def go(a):
            x, logits, k, w_gate, w_up, w_down = a
            weights, ids = kernels.moe_route(logits, k)
            return kernels.moe_experts(x, weights, ids, w_gate, w_up, w_down)

        return go

    return OpCase(
        "moe",
        f"T={tokens} E={experts} top{top_k} H={hidden} I={inter} {DTYPE_NAMES[dtype]}",
        make,
        run(ALIGNED),
        run(DEFAULT),
        lambda kernels, a: run(kernels)(a),
    )


SSM_HEADS, SSM_HEAD_DIM, SSM_GROUPS, SSM_STATE, CONV_WIDTH = 8, 32, 2, 64, 4


def _ssm_inputs(gen, tokens: int, dtype):
    x = torch.randn(tokens, SSM_HEADS, SSM_HEAD_DIM, generator=gen).to(dtype)
    dt = torch.randn(tokens, SSM_HEADS, generator=gen).to(dtype)
    B = torch.randn(tokens, SSM_GROUPS, SSM_STATE, generator=gen).to(dtype)
    C = torch.randn(tokens, SSM_GROUPS, SSM_STATE, generator=gen).to(dtype)
    A = -torch.rand(SSM_HEADS, generator=gen) - 0.1
    D = torch.randn(SSM_HEADS, generator=gen)
    dt_bias = torch.randn(SSM_HEADS, generator=gen) - 2.0
    return x, dt, A, B, C, D, dt_bias


def _ssm_prefill_case(seq_len: int, dtype) -> OpCase:
    def make():
        gen = torch.Generator().manual_seed(3)
        return (*_ssm_inputs(gen, seq_len, dtype), _cu([seq_len]), None, (1e-3, 1e2))

    return OpCase(
        "ssm_scan_prefill",
        f"L={seq_len} Hs={SSM_HEADS} P={SSM_HEAD_DIM} N={SSM_STATE} G={SSM_GROUPS} {DTYPE_NAMES[dtype]}",
        make,
        lambda a: ALIGNED.ssm_scan(*a),
        lambda a: DEFAULT.ssm_scan(*a),
    )


def _ssm_decode_case(batch: int, dtype) -> OpCase:
    def make():
        gen = torch.Generator().manual_seed(4)
        state = torch.randn(batch, SSM_HEADS, SSM_HEAD_DIM, SSM_STATE, generator=gen)
        return (*_ssm_inputs(gen, batch, dtype), _cu([1] * batch), state, (1e-3, 1e2))

    return OpCase(
        "ssm_scan_decode",
        f"B={batch} Hs={SSM_HEADS} P={SSM_HEAD_DIM} N={SSM_STATE} {DTYPE_NAMES[dtype]}",
        make,
        lambda a: ALIGNED.ssm_scan(*a),
        lambda a: DEFAULT.ssm_scan(*a),
    )


def _conv_case(lens: list[int], dtype) -> OpCase:
    channels = SSM_HEADS * SSM_HEAD_DIM + 2 * SSM_GROUPS * SSM_STATE

    def make():
        gen = torch.Generator().manual_seed(5)
        x = torch.randn(sum(lens), channels, generator=gen).to(dtype)
        weight = torch.randn(channels, CONV_WIDTH, generator=gen).to(dtype)
        bias = torch.randn(channels, generator=gen).to(dtype)
        state = torch.randn(len(lens), channels, CONV_WIDTH - 1, generator=gen).to(dtype)
        return x, weight, bias, _cu(lens), state

    phase = "decode" if max(lens) == 1 else "prefill"
    return OpCase(
        f"causal_conv1d_{phase}",
        f"seqs={len(lens)} L={max(lens)} C={channels} W={CONV_WIDTH} {DTYPE_NAMES[dtype]}",
        make,
        lambda a: ALIGNED.causal_conv1d(*a),
        lambda a: DEFAULT.causal_conv1d(*a),
    )


def build_cases(quick: bool = False) -> list[OpCase]:
    f32, b16 = torch.float32, torch.bfloat16
    cases = [_prefill_case(n, f32) for n in ((64, 512) if quick else (16, 64, 128, 256, 512))]
    cases += [_prefill_case(512, b16)]
    cases += [_decode_case(b, c, f32) for b, c in ((1, 512), (64, 512))]
    if not quick:
        cases += [_decode_case(b, c, f32) for b, c in ((1, 128), (8, 128), (8, 512), (64, 128))]
        cases += [_decode_case(16, 512, b16)]
    moe_shapes = [(1, 8, 2), (8, 8, 2), (64, 8, 2), (1, 16, 4), (16, 16, 4), (64, 16, 8)]
    cases += [_moe_case(t, e, k, f32) for t, e, k in (moe_shapes[::2] if quick else moe_shapes)]
    cases += [_moe_case(64, 16, 4, b16)]
    cases += [_ssm_prefill_case(n, f32) for n in ((128, 512) if quick else (64, 128, 512))]
    cases += [_ssm_decode_case(b, f32) for b in ((1, 64) if quick else (1, 16, 64))]
    cases += [_conv_case([512], f32), _conv_case([1] * 64, f32)]
    return cases + native_twins(cases)


def native_twins(cases: list[OpCase]) -> list[OpCase]:
    """The same cases of the ops the aligned-native set replaces, that set against default (none when
    it does not build here; the reason is in ``NATIVE_NOT_RUN``). benchmarks/ops.py calls it for its
    dense cases too."""
    twins = [c for c in cases if c.name in _NATIVE_OPS]
    native = _native_set() if twins else None
    return [] if native is None else [_native_twin(c, native) for c in twins]


#: benchmark op name -> the KernelSet op the aligned-native set implements natively
_NATIVE_OPS = {
    "attention_prefill": "attention",
    "attention_decode": "paged_attention",
    "ssm_scan_prefill": "ssm_scan",
    "ssm_scan_decode": "ssm_scan",
    "linear": "linear",
    "quant_linear": "quant_linear",
    "lm_head": "lm_head",
    "row_parallel_linear": "row_parallel_linear",
    "rms_norm": "rms_norm",
    "gated_rms_norm": "gated_rms_norm",
    "rope": "rope",
    "silu_mul": "silu_mul",
    "moe": "moe_experts",
    "causal_conv1d_prefill": "causal_conv1d",
    "causal_conv1d_decode": "causal_conv1d",
}


def _native_twin(case: OpCase, native) -> OpCase:
    """``case`` with the aligned-native set's op in the "aligned" column (same inputs, same default)."""
    name = f"{case.name}{NATIVE_SUFFIX}"
    if case.run_on is not None:
        return OpCase(
            name, case.shape_desc, case.make_inputs, lambda a: case.run_on(native, a), case.run_default
        )
    run = getattr(native, _NATIVE_OPS[case.name])
    return OpCase(name, case.shape_desc, case.make_inputs, lambda a: run(*a), case.run_default)


CASES: list[OpCase] = build_cases()


def measure_cpu_time(case: OpCase, repeats: int = 7, target_sample_s: float = 0.05) -> Timing:
    """Like ``timing.measure`` (interleaved medians) but with this thread's CPU time, 1 torch thread.

    On a shared, oversubscribed machine wall-clock medians of multi-threaded ops swing by 10x
    (OpenMP threads wait for descheduled siblings); CPU time of a single-threaded run still
    moves with cache contention but far less. Use it for A/B work there, not as the headline.
    """
    torch.set_num_threads(1)

    def sample(fn, inputs, inner: int) -> float:
        start = time.thread_time()
        for _ in range(inner):
            fn(inputs)
        return (time.thread_time() - start) / inner

    with torch.inference_mode():
        inputs = case.make_inputs()
        for _ in range(2):
            case.run_aligned(inputs)
            case.run_default(inputs)
        one = max(sample(case.run_aligned, inputs, 1), sample(case.run_default, inputs, 1), 1e-6)
        inner = max(1, min(1000, int(target_sample_s / one)))
        aligned, default = [], []
        for r in range(repeats):
            pair = [(aligned, case.run_aligned), (default, case.run_default)]
            for bucket, fn in pair if r % 2 == 0 else pair[::-1]:
                bucket.append(sample(fn, inputs, inner))
    return Timing(
        case.name, case.shape_desc, statistics.median(aligned) * 1e6, statistics.median(default) * 1e6
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller set of shapes")
    parser.add_argument(
        "--cpu-time", action="store_true", help="1 thread, CPU-time medians (shared machines)"
    )
    parser.add_argument("--only", default="", help="regex on 'name shape' to select cases")
    args = parser.parse_args()
    try:
        only = re.compile(args.only)
    except re.error as err:
        parser.error(f"--only {args.only!r} is not a regular expression: {err}")
    selected = [c for c in build_cases(quick=args.quick) if only.search(f"{c.name} {c.shape_desc}")]
    timings = [measure_cpu_time(c) if args.cpu_time else measure(c) for c in selected]
    print(format_table(timings))
    print()
    print(summarize(timings))
