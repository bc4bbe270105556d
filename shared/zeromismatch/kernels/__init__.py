"""Kernel sets: every numerically relevant op behind one switch.

``get_kernels("aligned")`` is the batch-, phase- and layout-invariant CPU
reference (pure torch); ``get_kernels("default")`` is the fastest stock torch
path, as a performance-minded, unaligned stack runs it; ``get_kernels("aligned-native")``
is the aligned set with its hot ops (attention, the Mamba2 scan and conv, the GEMMs, norms, rope,
the SwiGLU product, MoE experts) in fixed-order C (kernels/native); ``get_kernels("fast-native")``
is the unaligned baseline of equal effort that alignment's cost is measured against
(kernels/fast_native.py). A GPU set registers itself
under its own name when its extra is installed. See docs/parity.md.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import KernelSet, QuantizedWeight

_FACTORIES: dict[str, Callable[[], KernelSet]] = {}
_INSTANCES: dict[str, KernelSet] = {}


def register_kernels(name: str, factory: Callable[[], KernelSet]) -> None:
    """Register a KernelSet factory under ``name`` (idempotent for the same name)."""
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def available_kernels() -> list[str]:
    _register_builtin()
    return sorted(_FACTORIES)


def get_kernels(name: str | KernelSet) -> KernelSet:
    """Return the KernelSet registered as ``name`` (a KernelSet passes through)."""
    if isinstance(name, KernelSet):
        return name
    _register_builtin()
    if name not in _FACTORIES:
        raise ValueError(f"unknown kernel set {name!r}; available: {', '.join(sorted(_FACTORIES))}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _FACTORIES[name]()
    return _INSTANCES[name]


def _register_builtin() -> None:
    if "aligned" not in _FACTORIES:
        from .aligned import AlignedKernels

        register_kernels("aligned", AlignedKernels)
    if "default" not in _FACTORIES:
        from .default import DefaultKernels

        register_kernels("default", DefaultKernels)
    if "aligned-native" not in _FACTORIES:
        register_kernels("aligned-native", _native_kernels)
    if "fast-native" not in _FACTORIES:
        register_kernels("fast-native", _fast_native_kernels)


def _native_kernels() -> KernelSet:
    """The aligned set with its attention and Mamba2 scan in fixed-order C, compiled on first use
    (kernels/native); a missing compiler is one NativeBuildError naming it."""
    from .native import NativeKernels, _build

    _build.library()
    return NativeKernels()


def _fast_native_kernels() -> KernelSet:
    """The unaligned throughput baseline of equal effort (kernels/fast_native.py): the fastest op
    at each call, native C where that is fastest, a GEMM choice that follows the batch, capturable."""
    from .native import _build

    _build.library()
    from .fast_native import FastNativeKernels

    return FastNativeKernels()


__all__ = ["KernelSet", "QuantizedWeight", "available_kernels", "get_kernels", "register_kernels"]
