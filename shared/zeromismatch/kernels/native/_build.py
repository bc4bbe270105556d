"""Compile and load the native kernels (plain C; no torch extension build).

Calls go through a CPython fast-call module compiled into the same library (pyshim.c; ~0.2 us a
call instead of ctypes' ~2 us) when this interpreter's Python.h is present and the module builds
and loads, else through ctypes (the same C functions, so the same bits).

The shared library is built once per (source, compiler, flags, CPU) into
``$ZEROMISMATCH_NATIVE_CACHE`` (default ``~/.cache/zeromismatch/native``) and reused; a build
writes to a temporary file and renames it into place, so concurrent processes never load a
half-written library. ``-march=native`` only widens the SIMD lanes: the sources fix every
rounding step and ``-ffp-contract=off`` forbids the compiler's own fused multiply-adds, so the
bits do not depend on it (tests compare an ``-O0`` SSE2 build against it), and fixed_math.h
refuses to compile for x87 math or under fast-math. gemm.c's fused multiply-adds are explicit
(``fmaf`` or the AVX-512 FMA/vdpbf16ps instructions, the same single rounding) in its rule.

``$CC`` picks the compiler (default ``cc``; split like a shell word list, so ``ccache gcc``
works); it needs OpenMP (``-fopenmp``).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

_HERE = Path(__file__).parent
#: compiled together into one library; the header is part of the cache key
_SOURCE_NAMES = ("attention.c", "ssm.c", "gemm.c", "pointwise.c", "random.c", "moe.c", "conv.c", "swiglu.c")
SOURCES = tuple(_HERE / name for name in _SOURCE_NAMES)
HEADERS = (_HERE / "fixed_math.h", _HERE / "entry_points.h", _HERE / "threads.h")
#: the CPython fast-call entry points (pyshim.c), compiled in when Python's headers are present
SHIM = _HERE / "pyshim.c"
#: each C entry point's arguments as pyshim.c's wrappers parse them ('p' a pointer: an int address or
#: None; 'i' an int; 'L' an int64; 'f' a float) and its ctypes result type (entry_points.h declares
#: them; a test checks the fast-call module's signature strings against this table)
SIGNATURES = {
    "zm_attention": ("pLppiipLpLLpppLLLLLfpi", ctypes.c_int),
    "zm_ssm_scan": ("ppppppppppppppLLLLLLLLLffi", ctypes.c_int),
    "zm_panel_gemm": ("pLpLLiLLLiipi", ctypes.c_int),
    "zm_panel_gemm_reduced": ("pLpLLiLLLipii", ctypes.c_int),  # (bf16_nan_bits -1: an fp32 output)
    "zm_rms_norm": ("piLLLLLLipifpii", None),
    "zm_rope": ("piLLLLLppLipi", ctypes.c_int),
    "zm_moe_experts": ("piLLppLLLipLLipLLipi", ctypes.c_int),
    "zm_causal_conv1d": ("piLLpLppLpppippi", ctypes.c_int),
    "zm_uniform_rows": ("pLLp", None),
    "zm_race_argmax": ("ppLLp", None),
    "zm_silu_mul": ("ppiLLLLpi", None),
    # (these three: what a step graph replays for some torch ops, kernels/replay_lowering.py)
    "zm_copy_rows": ("pLpLpLpLLL", ctypes.c_int),
    "zm_copy_strided": ("ppLLLLLLLLLLLLL", None),
    "zm_add_f32": ("pppL", None),
    "zm_moe_route": ("ppLLLLLiiifpp", ctypes.c_int),
    "zm_silu_mul_reference": ("ppLp", None),  # ctypes only: the tests' scalar rule
}
_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int, "L": ctypes.c_int64, "f": ctypes.c_float}
#: the kernels' C entry points, each reached through the fast-call module when built, else ctypes
ENTRY_POINTS = tuple(name for name in SIGNATURES if name != "zm_silu_mul_reference")
#: the flags the sources' bitwise argument relies on: no FMA contraction, no fast-math. They go
#: last on the command line, so no earlier flag can override them.
REQUIRED_FLAGS = ("-ffp-contract=off", "-fno-fast-math")
DEFAULT_FLAGS = ("-O3", "-march=native")
#: the library's own calls between its functions (the fast-call wrappers, moe.c's GEMMs) bind to its
#: own definitions: with RTLD_GLOBAL in the dlopen flags (some MPI set-ups) a second build (the
#: tests' -O0 one) would otherwise call the first build's kernels through the PLT (found in review)
LINK_FLAGS = ("-Wl,-Bsymbolic",)
#: flags that would reassociate or contract floating-point math even before REQUIRED_FLAGS
_FORBIDDEN_PREFIXES = ("-Ofast", "-ffast-math", "-fassociative-math", "-funsafe-math", "-ffp-contract=")


class NativeBuildError(RuntimeError):
    """The native kernels could not be compiled or loaded (no compiler, no OpenMP, ...)."""


_lock = threading.Lock()
_loaded: dict[tuple[str, ...], ctypes.CDLL] = {}
#: what each loaded library was built with, for run provenance (``loaded_builds``)
_build_info: dict[tuple[str, ...], dict[str, str]] = {}
#: the flags ``library()`` builds with when none are given (tests swap in an ``-O0`` build)
build_flags: tuple[str, ...] = DEFAULT_FLAGS
#: (the build_flags and _loaded objects, the library) of the last default-flags call: every native op
#: calls ``library()`` per call, and building and hashing a flags tuple cost ~0.1 us of a ~3 us one-row
#: op. Compared by identity, so a test that swaps either is seen at once; so _loaded is only ever
#: added to (under _lock), never cleared or changed in place.
_default_library: tuple[object, object, NativeLibrary | None] = (None, None, None)


def cache_dir() -> Path:
    root = os.environ.get("ZEROMISMATCH_NATIVE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "zeromismatch" / "native"


def _cpu_fingerprint() -> str:
    """The CPU's feature flags: a ``-march=native`` library must not be loaded on another CPU
    (a shared home directory on a cluster)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def _compiler() -> list[str]:
    """``$CC`` split like a shell word list (``ccache gcc`` works), default ``cc``."""
    cc = shlex.split(os.environ.get("CC", "cc")) or ["cc"]
    if shutil.which(cc[0]) is None:
        raise NativeBuildError(
            f"the aligned-native kernels need a C compiler with OpenMP; {cc[0]!r} was not found "
            "(install gcc, or set CC)"
        )
    return cc


def _python_include() -> str | None:
    """The directory holding this interpreter's Python.h, or None (then the library is built without
    pyshim.c and every call goes through ctypes: the same kernels, ~2 us more per call)."""
    include = sysconfig.get_paths().get("include")
    return include if include and (Path(include) / "Python.h").is_file() else None


def _compile(cc: list[str], flags: tuple[str, ...], path: Path, include: str | None) -> None:
    """Compile into a temporary file beside ``path`` and rename it into place (atomic)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
    except OSError as err:
        raise NativeBuildError(
            f"cannot write the native kernel cache {path.parent}: {err} "
            "(set ZEROMISMATCH_NATIVE_CACHE to a writable directory)"
        ) from err
    sources = [str(source) for source in SOURCES]
    shim = [f"-I{include}", str(SHIM)] if include else []
    cmd = [*cc, *flags, *REQUIRED_FLAGS, "-fopenmp", "-fPIC", "-shared", *LINK_FLAGS, *sources, *shim]
    cmd += ["-o", tmp, "-lm"]
    try:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as err:
            raise NativeBuildError(f"running {cmd[0]} failed: {err}") from err
        if proc.returncode != 0:
            raise NativeBuildError(f"compiling the native kernels failed ({' '.join(cmd)}):\n{proc.stderr}")
        if os.path.getsize(tmp) == 0:
            raise NativeBuildError(f"{' '.join(cmd)} exited 0 but wrote no library")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class NativeLibrary:
    """The loaded library: ``cdll`` (ctypes), ``module`` (the fast-call module, or None), and each of
    ``ENTRY_POINTS`` as an attribute taking the same arguments (ints for pointers, None for NULL),
    from the fast-call module when it was built (``fast`` is True), else the ctypes function."""

    def __init__(self, cdll: ctypes.CDLL, module) -> None:
        self.cdll = cdll
        self.module = module
        self.fast = module is not None
        for name in ENTRY_POINTS:
            setattr(self, name, getattr(module if module is not None else cdll, name))
        #: pyshim.c's tensor-level silu_mul (swiglu.py), or None through ctypes
        self.silu_mul_tensors = None
        if module is not None:
            import torch  # (here: this module is torch-free until a library is loaded)

            from ._device import CPU

            module.bind_torch(
                torch.Tensor, torch.float32, torch.bfloat16, torch.empty_like, torch.empty,
                torch.is_grad_enabled, torch.get_num_threads, CPU,
            )  # fmt: skip
            self.silu_mul_tensors = module.silu_mul_tensors


def _load_module(path: Path):
    """pyshim.c's ``zm_native`` module from the library at ``path`` (not entered in sys.modules: an
    -O0 test build is another file with the same module name)."""
    loader = importlib.machinery.ExtensionFileLoader("zm_native", str(path))
    spec = importlib.util.spec_from_loader("zm_native", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _load(path: Path, shim: bool) -> NativeLibrary:
    try:
        module = _load_module(path) if shim else None
    except ImportError as err:
        raise OSError(f"the fast-call module in {path} does not load: {err}") from err
    lib = ctypes.CDLL(str(path))
    for name, (signature, result) in SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes = [_CTYPES[kind] for kind in signature]
        function.restype = result
    return NativeLibrary(lib, module)


def library(flags: tuple[str, ...] | None = None) -> NativeLibrary:
    """The compiled native library (attention, SSM scan and conv, GEMM, RMSNorm/RoPE, MoE experts,
    the sampler's noise) for ``flags`` (default ``build_flags``; REQUIRED_FLAGS are always appended),
    built on first use, then cached on disk and in this process."""
    global _default_library
    requested = None
    if flags is None:
        built_for, built_in, lib = _default_library
        if built_for is build_flags and built_in is _loaded:
            return lib
        requested = build_flags
    flags = tuple(build_flags if flags is None else flags)
    lib = _loaded.get(flags)  # the per-call path (a GEMM of one row costs microseconds): no lock
    if lib is not None:
        if requested is not None:
            _default_library = (requested, _loaded, lib)
        return lib
    bad = [f for f in flags if f.startswith(_FORBIDDEN_PREFIXES)]
    if bad:
        raise NativeBuildError(f"the native kernels' fixed rounding forbids the flags {bad}")
    with _lock:
        lib = _loaded.get(flags)
        if lib is not None:
            return lib
        cc = _compiler()
        include = _python_include()
        try:
            version = subprocess.run([*cc, "--version"], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as err:
            raise NativeBuildError(f"{' '.join(cc)} --version failed: {err}") from err
        try:
            lib, key = _build_and_load(cc, flags, version, include)
            calls = "cpython fast-call" if include else "ctypes"
        except NativeBuildError as err:
            if include is None:
                raise
            # the kernels without the fast-call module: a broken or mismatched Python.h must not take
            # the whole set away (found in review); calls go through ctypes, the same bits
            lib, key = _build_and_load(cc, flags, version, None)
            calls = f"ctypes (the fast-call module failed: {str(err).splitlines()[0][:200]})"
        _loaded[flags] = lib
        _build_info[flags] = {
            "compiler": version.splitlines()[0] if version else " ".join(cc),
            "flags": " ".join((*flags, *REQUIRED_FLAGS, *LINK_FLAGS)),
            "cache_key": key,
            "calls": calls,
        }
        return lib


def _build_and_load(cc: list[str], flags: tuple[str, ...], version: str, include: str | None):
    """``(library, cache key)`` for these flags, with the fast-call module when ``include`` (the
    Python.h directory) is given; built into the cache unless a build is there already."""
    key = hashlib.sha256(
        b"\0".join(
            [
                *(path.read_bytes() for path in (*SOURCES, *HEADERS, SHIM)),
                version.encode(),
                " ".join((*flags, *REQUIRED_FLAGS, *LINK_FLAGS)).encode(),
                _cpu_fingerprint().encode(),
                # the shim is built against this interpreter's headers and ABI
                f"shim {include} {sys.version} {sysconfig.get_config_var('EXT_SUFFIX')}".encode()
                if include
                else b"no shim",
            ]
        )
    ).hexdigest()[:16]
    path = cache_dir() / key / "zm_native.so"
    if not path.exists():
        _compile(cc, flags, path, include)
    try:
        return _load(path, include is not None), key
    except (OSError, AttributeError):  # a damaged cache entry (or a missing symbol): build it again, once
        _compile(cc, flags, path, include)
        try:
            return _load(path, include is not None), key
        except (OSError, AttributeError) as err:
            raise NativeBuildError(f"loading {path} failed: {err}") from err


def loaded_builds() -> list[dict[str, str]]:
    """The native libraries this process has loaded: compiler, flags, cache key (provenance)."""
    return [dict(info) for info in _build_info.values()]


def unavailable_reason() -> str | None:
    """Why the native kernels cannot be built and loaded here (the NativeBuildError message), or
    None when they can: for skip reasons and for benchmarks that report a missing row."""
    try:
        library()
    except NativeBuildError as err:
        return str(err)
    return None


def available() -> bool:
    """Whether the native kernels build and load here."""
    return unavailable_reason() is None
