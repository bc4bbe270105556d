"""How the aligned-native kernels are called, not what they compute: the CPython fast-call entry
points (pyshim.c) give the ctypes path's bits and refuse bad arguments; the packed-weight cache's
one-weight front serves exactly what the main map would; gemm.c's in-register bf16 rounding of
row-parallel partials (vcvtneps2bf16) gives the portable rule's bits on nan, inf and overflow."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import scaled_randn

from zeromismatch.kernels.aligned import gemm as aligned_gemm
from zeromismatch.kernels.native import NativeKernels, _build, swiglu
from zeromismatch.kernels.native import gemm as native_gemm

pytestmark = pytest.mark.native  # skipped without a C compiler, except under CI (tests/conftest.py)

NATIVE = NativeKernels()


def test_fast_calls_are_built_where_python_headers_are():
    lib = _build.library()
    assert lib.fast == (_build._python_include() is not None)
    assert _build.loaded_builds()[-1]["calls"] == ("cpython fast-call" if lib.fast else "ctypes")


def test_fast_call_signatures_are_the_ctypes_table():
    """pyshim.c parses each entry point's arguments by a signature string of its own (its docstring);
    the ctypes argtypes come from _build.SIGNATURES: the two must name the same arguments."""
    lib = _build.library()
    if not lib.fast:
        pytest.skip("built without Python.h: every call is the ctypes one")
    for name in _build.ENTRY_POINTS:
        assert getattr(lib.module, name).__doc__ == _build.SIGNATURES[name][0], name
    assert set(_build.ENTRY_POINTS) == {n for n in dir(lib.module) if n.startswith("zm_")}


def test_fast_call_and_ctypes_give_the_same_bits():
    lib = _build.library()
    if not lib.fast:
        pytest.skip("built without Python.h: every call is the ctypes one")
    gen = torch.Generator().manual_seed(0)
    x, w = scaled_randn(gen, 5, 64), scaled_randn(gen, 64, 64, scale=0.2)
    packed = native_gemm._cached_panels(w, torch.float32)
    outs = []
    for fn in (lib.zm_panel_gemm, lib.cdll.zm_panel_gemm):
        out = torch.empty(5, 64)
        args = (x.data_ptr(), 64, packed.data_ptr(), packed.shape[0], 64, 0, 5, 64, 4, 0, 1)
        assert fn(*args, out.data_ptr(), 1) == 0
        outs.append(out)
    assert torch.equal(*outs)
    # a float argument (eps) converted as ctypes converts it, and a void call returning None
    norms = []
    for fn in (lib.zm_rms_norm, lib.cdll.zm_rms_norm):
        out = torch.empty(5, 64)
        weight = torch.ones(64)
        shape = (1, 5, 0, 64, 64, 64, 0)
        assert fn(x.data_ptr(), 0, *shape, weight.data_ptr(), 0, 1e-6, out.data_ptr(), 0, 1) is None
        norms.append(out)
    assert torch.equal(*norms)
    noise = []
    for fn in (lib.zm_uniform_rows, lib.cdll.zm_uniform_rows):
        seeds, out = torch.tensor([3, 5, 7], dtype=torch.int64), torch.empty(3, 10)
        fn(seeds.data_ptr(), 3, 10, out.data_ptr())
        noise.append(out)
    assert torch.equal(*noise)


def test_fast_call_refuses_bad_arguments():
    lib = _build.library()
    if not lib.fast:
        pytest.skip("built without Python.h: every call is the ctypes one")
    with pytest.raises(TypeError, match="zm_panel_gemm takes 13 arguments"):
        lib.zm_panel_gemm(0, 1)
    with pytest.raises(TypeError, match="argument 1 must be an integer, not float"):
        lib.zm_panel_gemm(0, 1.5, *([0] * 11))
    with pytest.raises(TypeError, match="argument 3 must be an integer, not str"):
        lib.zm_panel_gemm(0, 1, 0, "4", *([0] * 9))
    # pieces = 0 is refused by the kernel before anything is read; None is a NULL pointer
    assert lib.zm_panel_gemm(None, 1, None, 4, 8, 0, 1, 1, 0, 0, 1, None, 1) == 1


def _front_size() -> int:
    return len(aligned_gemm._PACKED.front)


def test_one_weight_front_serves_only_what_the_main_map_holds():
    gen = torch.Generator().manual_seed(1)
    x, w = scaled_randn(gen, 1, 32), scaled_randn(gen, 48, 32, scale=0.2)
    aligned_gemm.clear_packed_weights()
    with torch.no_grad():
        first = NATIVE.linear(x, w)
        assert _front_size() == 1 and torch.equal(NATIVE.linear(x, w), first)
        w.mul_(2)  # a version bump: the front entry is stale, the main map rebuilds
        assert torch.equal(NATIVE.linear(x, w), (first.double() * 2).float())
        aligned_gemm.clear_packed_weights()
        assert _front_size() == 0
        saved = aligned_gemm._PACKED.budget_bytes
        try:
            NATIVE.linear(x, w)
            aligned_gemm._PACKED.budget_bytes = 0  # caching turned off: the front must not answer
            calls = []
            build = native_gemm._pack
            native_gemm._pack = lambda *a: calls.append(1) or build(*a)
            try:
                NATIVE.linear(x, w)
            finally:
                native_gemm._pack = build
            assert calls == [1]  # packed afresh, not served
            # a weight over a quarter of the budget is packed per call and never enters the front
            aligned_gemm._PACKED.budget_bytes = 4 * w.numel() * 4 - 1
            aligned_gemm.clear_packed_weights()
            NATIVE.linear(x, w)
            assert _front_size() == 0 and not aligned_gemm._PACKED.entries
        finally:
            aligned_gemm._PACKED.budget_bytes = saved
            aligned_gemm.clear_packed_weights()


def test_front_entry_dies_with_its_weight():
    gen = torch.Generator().manual_seed(2)
    x = scaled_randn(gen, 1, 32)
    aligned_gemm.clear_packed_weights()
    with torch.no_grad():
        w = scaled_randn(gen, 48, 32)
        NATIVE.linear(x, w)
        assert _front_size() == 1
        del w  # the main entry's weak reference fires, and the front (holding the panels) empties
        assert _front_size() == 0 and not aligned_gemm._PACKED.entries


def test_bf16_partials_round_like_the_portable_rule_on_nan_inf_and_overflow(monkeypatch):
    """vcvtneps2bf16 treats denormal inputs as zero; the bf16 rule's accumulators are never denormal,
    so its rounding must equal zm_round_bf16's (the -O0 build) on every value, specials included;
    and the bf16 output the engine's call writes in C must be torch's cast of the fp32 result."""
    gen = torch.Generator().manual_seed(3)
    x = scaled_randn(gen, 7, 64, dtype=torch.bfloat16)
    w = scaled_randn(gen, 40, 64, dtype=torch.bfloat16, scale=0.3)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    # a finite fp32 partial above the bf16 maximum (3.3895e38), which the rounding turns into inf:
    # 2^127 * (1 + 126/128) times 1 + 2^-7 = 3.40265e38, alone in its row (piece 0 holds k = 0..15)
    x[2] = 0.0
    x[2, 0] = 2.0**127 * 1.984375
    w[:, 0] = 1.0078125
    x[3, 9] = float("-inf")
    # partials near FLT_MIN (2^-63 * 2^-63 = 2^-126), where the bf16 rule flushes what falls below it
    x[4] = 0.0
    x[4, 1], x[4, 2] = 2.0**-63, 2.0**-64
    w[:, 1], w[:, 2] = 2.0**-63, 2.0**-63
    with torch.no_grad():
        vectorized = NATIVE.row_parallel_linear(x, w)
        monkeypatch.setattr(_build, "build_flags", ("-O0",))
        scalar = NATIVE.row_parallel_linear(x, w)
    assert torch.equal(vectorized.view(torch.int16), scalar.view(torch.int16))
    assert vectorized.isnan().any() and vectorized.isinf().any()  # the specials were reached
    assert vectorized[2].isinf().all()  # the overflow, from finite inputs
    tiny = vectorized[4].float().abs()
    assert ((tiny > 0) & (tiny < 1e-37)).any()  # normal partials just above FLT_MIN survived
    # the engine's call writes bf16 itself: torch's cast of the same fp32 sums (the autograd route's
    # .to(bfloat16)), nan encoding included
    monkeypatch.undo()
    general = NATIVE.row_parallel_linear(x.clone().requires_grad_(), w).detach()
    assert torch.equal(general.view(torch.int16), vectorized.view(torch.int16))
    linear_fast = NATIVE.linear(x, w)
    linear_general = NATIVE.linear(x.clone().requires_grad_(), w).detach()
    assert torch.equal(linear_fast.view(torch.int16), linear_general.view(torch.int16))


def test_fast_call_refuses_a_non_int_address():
    """As ctypes' c_void_p: a tensor (or anything else with __index__) passed for a pointer would be a
    wild address; integers elsewhere may come through __index__, as ctypes' integer types take them."""
    lib = _build.library()
    if not lib.fast:
        pytest.skip("built without Python.h: every call is the ctypes one")
    with pytest.raises(TypeError, match="argument 0 must be an address"):
        lib.zm_panel_gemm(torch.tensor([5]), *([1] * 12))


def test_library_binds_its_own_calls_to_itself():
    """With RTLD_GLOBAL in the dlopen flags a second build (the tests' -O0 one) would call the first
    build's kernels through the PLT from its fast-call wrappers (found in review); -Bsymbolic binds
    the library's calls to its own definitions."""
    import shutil
    import subprocess

    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed")
    _build.library()
    key = _build.loaded_builds()[-1]["cache_key"]
    dynamic = subprocess.run(
        ["readelf", "-d", str(_build.cache_dir() / key / "zm_native.so")], capture_output=True, text=True
    )
    assert "SYMBOLIC" in dynamic.stdout


def test_engine_bf16_output_uses_this_torchs_nan_encoding(tmp_path):
    """torch's fp32 -> bf16 cast writes a nan as 0xffff (vectorized) or 0x7fc0 (c10's scalar cast, e.g.
    under ATEN_CPU_CAPABILITY=default); the engine's call writes bf16 in C and must match the
    trainer's route (torch's cast) in either process (found in review)."""
    import os
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from zeromismatch.kernels.native import NativeKernels, gemm\n"
        "N = NativeKernels()\n"
        "x = torch.randn(5, 64).bfloat16(); w = torch.randn(24, 64).bfloat16(); x[1, 3] = float('nan')\n"
        "with torch.no_grad(): fast = N.row_parallel_linear(x, w)\n"
        "general = N.row_parallel_linear(x.clone().requires_grad_(), w).detach()\n"
        "assert fast.isnan().any()\n"
        "assert torch.equal(fast.view(torch.int16), general.view(torch.int16))\n"
        "print(hex(gemm.torch_bf16_nan_bits()))\n"
    )
    encodings = set()
    for capability in ("default", None):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("ATEN_CPU_CAPABILITY", None)
        if capability:
            env["ATEN_CPU_CAPABILITY"] = capability
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        encodings.add(proc.stdout.strip())
    assert "0x7fc0" in encodings  # the scalar cast was exercised, not only the vectorized one


def test_nan_probe_ignores_the_default_dtype():
    """The probe casts fp32, as the trainer's route does, whatever the default dtype (a bf16 default
    made it report bf16 -> bf16's encoding; found in review)."""
    expected = native_gemm.torch_bf16_nan_bits()
    saved = torch.get_default_dtype()
    try:
        for dtype in (torch.float64, torch.bfloat16, torch.float16):
            torch.set_default_dtype(dtype)
            assert native_gemm.torch_bf16_nan_bits() == expected
    finally:
        torch.set_default_dtype(saved)


def test_native_ops_allocate_on_the_cpu_whatever_the_default_device():
    """Outputs the C code writes through raw pointers must be CPU tensors even under another default
    device ("meta" stands in for a GPU; the process used to crash)."""
    gen = torch.Generator().manual_seed(6)
    x, w = scaled_randn(gen, 3, 32), scaled_randn(gen, 24, 32)
    g, u = scaled_randn(gen, 3, 32), scaled_randn(gen, 3, 32)
    fused = scaled_randn(gen, 3, 64)  # gate and up as slices of one projection: not contiguous rows

    def ops():
        return (
            NATIVE.linear(x, w),
            NATIVE.row_parallel_linear(x, w[:, :32]),
            NATIVE.silu_mul(g, u),
            NATIVE.silu_mul(fused[:, :32], fused[:, 32:]),
        )

    with torch.no_grad():
        expected = ops()
        torch.set_default_device("meta")
        try:
            got = ops()
        finally:
            torch.set_default_device(None)
    for a, b in zip(expected, got):
        assert b.device.type == "cpu" and torch.equal(a, b)


def test_short_lived_view_weights_leave_no_front_entries():
    gen = torch.Generator().manual_seed(7)
    x, base = scaled_randn(gen, 1, 32), scaled_randn(gen, 96, 32)
    aligned_gemm.clear_packed_weights()
    with torch.no_grad():
        for _ in range(50):
            NATIVE.linear(x, base[:48])  # a new view object each call, dead after it
    assert _front_size() <= 1
    aligned_gemm.clear_packed_weights()


def test_a_broken_python_header_falls_back_to_ctypes(monkeypatch, tmp_path):
    """A Python.h that does not compile (a mismatched or partial install) must not take the native
    set away: the kernels are built without the fast-call module and called through ctypes."""
    include = tmp_path / "include"
    include.mkdir()
    (include / "Python.h").write_text("#error not a usable Python.h\n")
    monkeypatch.setattr(_build, "_python_include", lambda: str(include))
    monkeypatch.setenv("ZEROMISMATCH_NATIVE_CACHE", str(tmp_path / "cache"))
    gen = torch.Generator().manual_seed(8)
    g, u = scaled_randn(gen, 2, 40), scaled_randn(gen, 2, 40)
    expected = NATIVE.silu_mul(g, u)  # by the default build (the tensor-level call where it is built)
    monkeypatch.setattr(_build, "_loaded", {})
    monkeypatch.setattr(_build, "_build_info", {})
    lib = _build.library()
    assert not lib.fast and lib.silu_mul_tensors is None
    assert _build.loaded_builds()[-1]["calls"].startswith("ctypes (the fast-call module failed")
    assert torch.equal(NATIVE.silu_mul(g, u), expected)  # the general path, through ctypes
    out = torch.empty(3, 10)
    seeds = torch.tensor([1, 2, 3], dtype=torch.int64)
    lib.zm_uniform_rows(seeds.data_ptr(), 3, 10, out.data_ptr())
    assert ((out >= 0) & (out < 1)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tensor_level_silu_mul_is_the_general_path(dtype):
    """pyshim.c's silu_mul_tensors reads the tensors in C: it must give swiglu.py's general path's
    bits and a new contiguous output, for fused-projection slices, contiguous rows and one row."""
    lib = _build.library()
    if not lib.fast:
        pytest.skip("built without Python.h: silu_mul takes the general path")
    gen = torch.Generator().manual_seed(9)
    fused = scaled_randn(gen, 5, 74, scale=4.0).to(dtype)
    g, u = scaled_randn(gen, 5, 37, scale=4.0).to(dtype), scaled_randn(gen, 5, 37).to(dtype)
    one_g, one_u = scaled_randn(gen, 1, 1024, scale=4.0).to(dtype), scaled_randn(gen, 1, 1024).to(dtype)
    for gate, up in ((fused[:, :37], fused[:, 37:]), (g, u), (g, fused[:, 37:]), (one_g, one_u)):
        out = lib.silu_mul_tensors(gate, up)
        assert out is not None and out.is_contiguous() and out.dtype == dtype and out.shape == gate.shape
        assert torch.equal(out, swiglu._silu_mul(gate, up))
        assert out.data_ptr() not in (gate.data_ptr(), up.data_ptr())
    leaf = g.clone().requires_grad_(True)
    with torch.no_grad():  # no gradient to record: the C call takes it
        assert torch.equal(lib.silu_mul_tensors(leaf, u), swiglu._silu_mul(g, u))


class _Subclass(torch.Tensor):
    pass


class _ShortAllocation(torch.Tensor):
    """A subclass whose empty_like hands back one element: a C call trusting it would overrun."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.empty_like:
            return torch.empty(1, 1)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_tensor_level_silu_mul_declines_the_other_cases():
    """Every input outside the one case goes back to the general path (None): another rank, shape or
    dtype, a lazily negated view, rows of non-unit stride, no elements, a gradient to record, a
    tensor off the CPU; and NATIVE.silu_mul still answers each (its own errors included)."""
    lib = _build.library()
    if not lib.fast:
        pytest.skip("built without Python.h: silu_mul takes the general path")
    g = torch.randn(3, 8)
    grad_leaf = torch.randn(3, 8, requires_grad=True)
    declined = [
        (g.view(3, 2, 4), g.view(3, 2, 4)),
        (g, torch.randn(3, 9)),
        (g, g.to(torch.bfloat16)),
        (g.double(), g.double()),
        (g._neg_view(), g),
        (g, g._neg_view()),
        (g.t(), g.t()),
        (g[:0], g[:0]),
        (grad_leaf, g),
        (g, grad_leaf),
        (torch.empty(3, 8, device="meta"), g),
        (g.as_subclass(_Subclass), g),  # its __torch_function__ would answer the reads and empty_like
        (g, g.as_subclass(_Subclass)),
        (torch.nn.Parameter(g.clone(), requires_grad=False), g),
    ]
    for gate, up in declined:
        assert lib.silu_mul_tensors(gate, up) is None
    assert torch.equal(NATIVE.silu_mul(g._neg_view(), g), NATIVE.silu_mul(-g, g))
    assert torch.equal(NATIVE.silu_mul(g.t(), g.t()), NATIVE.silu_mul(g.t().contiguous(), g.t().contiguous()))
    assert NATIVE.silu_mul(grad_leaf, g).requires_grad
    with pytest.raises(ValueError):
        NATIVE.silu_mul(torch.empty(3, 8, device="meta"), g)
    with pytest.raises(TypeError):
        lib.silu_mul_tensors(g)
    short_g, short_u = (torch.randn(2, 512).as_subclass(_ShortAllocation) for _ in range(2))
    assert lib.silu_mul_tensors(short_g, short_u) is None
    out = NATIVE.silu_mul(short_g, short_u)  # the general path allocates with torch.empty
    assert out.shape == (2, 512)
    plain_g, plain_u = short_g.as_subclass(torch.Tensor), short_u.as_subclass(torch.Tensor)
    assert torch.equal(out.as_subclass(torch.Tensor), NATIVE.silu_mul(plain_g, plain_u))
