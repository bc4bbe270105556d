"""The aligned-native kernel set: the aligned set with attention and the Mamba2 scan in C.

Every other op is the pure-torch aligned op (``kernels/aligned``); ``attention`` and
``paged_attention`` come from ``attention.py`` here and ``ssm_scan`` from ``ssm.py``, whose C
sources are compiled with the system C compiler on first use (``_build.py``). Every value the C
code produces is one fixed sequence of IEEE operations, so the set keeps the aligned set's
invariances by construction; its bits differ from the pure-torch aligned set's, so the engine
and the trainer must both run it. CPU only; needs a C compiler with OpenMP.

    zm parity --model tiny-qwen3 --kernels aligned-native
"""

from __future__ import annotations

from .._modules import kernel_set_from_modules
from ..aligned import dense, moe
from ..aligned import ssm as aligned_ssm
from . import attention, ssm
from ._build import NativeBuildError, available, unavailable_reason

NativeKernels = kernel_set_from_modules(
    "NativeKernels",
    "aligned-native",
    [attention, ssm, dense, moe, aligned_ssm],
    __doc__.splitlines()[0],
    promises_invariance=True,
)

__all__ = ["NativeBuildError", "NativeKernels", "available", "unavailable_reason"]
