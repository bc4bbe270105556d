"""The default kernel set: the fastest stock torch path, as an unaligned stack runs it.

It is *not* slowed down to flatter a ratio: F.linear, scaled_dot_product_attention for
prefill and a separate decode path, an lm_head in the activation dtype, batch-wide
choices where fast stacks make them. dense.py holds the dense ops, sequence.py the
attention, MoE and SSM ops.
"""

from __future__ import annotations

from .._modules import kernel_set_from_modules
from . import dense, sequence

DefaultKernels = kernel_set_from_modules(
    "DefaultKernels", "default", [dense, sequence], __doc__.splitlines()[0]
)
