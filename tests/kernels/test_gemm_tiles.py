"""Portable fixed-tile GEMM mode (``ZEROMISMATCH_GEMM_TILE_ROWS``): every library call gets exactly
T rows. On this CPU it keeps every aligned promise and the default mode's bits (except the small
fp32 K-pieces, which leave the batched MKL GEMM); what it buys elsewhere is measured in
results/reproduced/portability/ (docs/parity.md, "Portability")."""

from __future__ import annotations

import pytest
import torch

from zeromismatch._provenance import provenance
from zeromismatch.kernels import get_kernels, selfcheck
from zeromismatch.kernels.aligned import gemm
from zeromismatch.kernels.selfcheck import run_checks

ALIGNED = get_kernels("aligned")


@pytest.fixture
def tiles():
    gemm.set_gemm_tile_rows(16)
    try:
        yield
    finally:
        gemm.set_gemm_tile_rows(0)


def test_every_aligned_check_holds_in_tile_mode(tiles):
    failing = [(r.op, r.prop, r.dtype) for r in run_checks(ALIGNED, "cpu") if not r.identical]
    assert failing == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tile_mode_keeps_the_default_modes_bits_for_whole_weights(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(100, 1024, generator=gen).to(dtype)
    w = (torch.randn(768, 1024, generator=gen) / 32).to(dtype)
    experts = [(torch.randn(4, 128, 1024, generator=gen) / 32).to(dtype) for _ in range(2)]
    down = (torch.randn(4, 1024, 128, generator=gen) / 12).to(dtype)
    ids = torch.randint(0, 4, (100, 2), generator=gen)
    weights = torch.rand(100, 2, generator=gen)

    def outputs():
        return [
            ALIGNED.linear(x[:1], w),
            ALIGNED.linear(x[:17], w),
            ALIGNED.linear(x, w),
            ALIGNED.lm_head(x[:33], w),
            ALIGNED.row_parallel_linear(x, w),  # 256-wide pieces x 768 > the batched-piece limit
            ALIGNED.moe_experts(x, weights, ids, experts[0], experts[1], down),
        ]

    with torch.no_grad():
        plain = outputs()
        gemm.set_gemm_tile_rows(16)
        try:
            tiled = outputs()
        finally:
            gemm.set_gemm_tile_rows(0)
    for a, b in zip(plain, tiled):
        assert torch.equal(a, b)


def test_tile_mode_trains(tiles):
    x = torch.randn(37, 64, requires_grad=True)
    w = torch.randn(48, 64, requires_grad=True)
    out = ALIGNED.linear(x, w)
    out.square().sum().backward()
    assert torch.equal(out.detach(), ALIGNED.linear(x.detach(), w.detach()))
    assert x.grad is not None and w.grad is not None


def test_bad_tile_rows_get_one_clear_error(monkeypatch):
    for bad in (1, -16):
        with pytest.raises(ValueError, match="ZEROMISMATCH_GEMM_TILE_ROWS"):
            gemm.set_gemm_tile_rows(bad)
    monkeypatch.setenv(gemm.TILE_ROWS_ENV, "sixteen")
    with pytest.raises(ValueError, match="got 'sixteen'"):
        gemm._tile_rows_from_env()
    monkeypatch.setenv(gemm.TILE_ROWS_ENV, "16")
    assert gemm._tile_rows_from_env() == 16
    assert gemm.gemm_tile_rows() == 0  # reading the variable does not switch the running process


def test_mode_is_recorded_and_re_verified(tiles):
    assert provenance()["numerics"]["gemm_tile_rows"] == 16  # (native_builds too, once one is loaded)
    before = len(selfcheck._verified)
    selfcheck.verify_invariance(ALIGNED, "cpu", torch.bfloat16)
    gemm.set_gemm_tile_rows(32)
    selfcheck.verify_invariance(ALIGNED, "cpu", torch.bfloat16)
    assert len(selfcheck._verified) >= before + 1  # a new mode is measured anew


def test_fixed_batch_attention_matmul_has_the_plain_bits_on_this_cpu():
    # the portable mode's attention GEMMs off the CPU go in calls of a fixed batch count; on this
    # CPU the batched matmul is batch-count invariant (>= 16 rows), so both orders agree bitwise
    from zeromismatch.kernels.aligned.attention import _fixed_batch_matmul

    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(7, 1, 16, 64, generator=gen), torch.randn(7, 5, 64, 64, generator=gen)
    assert torch.equal(_fixed_batch_matmul(a, b, (7, 5)), torch.matmul(a, b))


@pytest.mark.slow
def test_parity_chain_holds_in_tile_mode_across_processes_and_tp():
    # the mode is a process-wide switch: the engine's TP workers inherit it from the environment
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, gemm.TILE_ROWS_ENV: "8"}
    args = ["--model", "tiny-qwen3-moe", "--kernels", "aligned", "--num-prompts", "4", "--max-tokens", "8"]
    cmd = [
        sys.executable,
        "-m",
        "zeromismatch.cli",
        "parity",
        *args,
        "--tp",
        "2",
        "--trainer-tp",
        "1",
        "--json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["identical"] is True and result["diff_max"] == 0.0 and result["tokens"] > 0
    assert result["numerics"] == {"gemm_tile_rows": 8}
