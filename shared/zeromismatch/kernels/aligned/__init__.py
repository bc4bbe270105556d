"""The aligned kernel set: invariant CPU reference in pure torch.

Each op is the module function of the same name: dense.py / gemm.py (GEMMs, norms,
RoPE, activations, lm_head and logprobs, quantized linear), attention.py (split-KV
attention over contiguous or paged K/V), moe.py (routing and experts), ssm.py
(causal conv and Mamba2 scan). The invariance argument for every op is in
docs/parity.md.
"""

from __future__ import annotations

from .._modules import kernel_set_from_modules
from . import attention, dense, moe, ssm

AlignedKernels = kernel_set_from_modules(
    "AlignedKernels",
    "aligned",
    [dense, attention, moe, ssm],
    __doc__.splitlines()[0],
    promises_invariance=True,
)
