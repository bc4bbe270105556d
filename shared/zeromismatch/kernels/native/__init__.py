"""The aligned-native kernel set: the aligned set with attention in a fixed-order C kernel.

Every op but attention is the pure-torch aligned op (``kernels/aligned``); ``attention`` and
``paged_attention`` come from ``attention.py`` here, which compiles ``attention.c`` with the
system C compiler on first use (``_build.py``). The set promises the same invariances as
"aligned", but its attention bits differ from the pure-torch aligned attention's, so the
engine and the trainer must both run it. CPU only; needs a C compiler with OpenMP.

    zm parity --model tiny-qwen3 --kernels aligned-native
"""

from __future__ import annotations

from .._modules import kernel_set_from_modules
from ..aligned import dense, moe, ssm
from . import attention
from ._build import NativeBuildError, available, unavailable_reason

NativeKernels = kernel_set_from_modules(
    "NativeKernels",
    "aligned-native",
    [attention, dense, moe, ssm],
    __doc__.splitlines()[0],
    promises_invariance=True,
)

__all__ = ["NativeBuildError", "NativeKernels", "available", "unavailable_reason"]
