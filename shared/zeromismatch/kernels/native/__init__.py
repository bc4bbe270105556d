"""The aligned-native kernel set: the aligned set with its hot ops in fixed-order C.

Those ops are attention and paged_attention (``attention.py``), the Mamba2 ``ssm_scan``
(``ssm.py``) and ``causal_conv1d`` (``conv.py``), ``linear``, ``quant_linear``, ``lm_head`` and
``row_parallel_linear`` (``gemm.py``), ``rms_norm``, ``gated_rms_norm`` and ``rope``
(``pointwise.py``), ``silu_mul`` (``swiglu.py``), ``moe_experts`` (``experts.py``) and
``moe_route`` (``route.py``: the aligned route's bits, its selection in C); every other op is the
pure-torch aligned
op (``kernels/aligned``). The C
sources are compiled with the system C compiler on first use (``_build.py``). Every value the C
code produces is one fixed sequence of IEEE operations, so the set keeps the aligned set's
invariances by construction; its bits differ from the pure-torch aligned set's, so the engine
and the trainer must both run it. CPU only: every op raises one ValueError for a tensor on another
device, never falling back to the aligned op (``_device.py``); needs a C compiler with OpenMP.

    zm parity --model tiny-qwen3 --kernels aligned-native
"""

from __future__ import annotations

from .._modules import kernel_set_from_modules
from ..aligned import dense, moe
from ..aligned import ssm as aligned_ssm
from . import attention, conv, experts, gemm, pointwise, route, ssm, swiglu
from ._build import NativeBuildError, available, unavailable_reason

NativeKernels = kernel_set_from_modules(
    "NativeKernels",
    "aligned-native",
    [attention, ssm, conv, gemm, pointwise, swiglu, experts, route, dense, moe, aligned_ssm],
    __doc__.splitlines()[0],
    promises_invariance=True,
)

__all__ = ["NativeBuildError", "NativeKernels", "available", "unavailable_reason"]
