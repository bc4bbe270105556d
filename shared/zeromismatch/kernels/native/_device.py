"""The aligned-native set's one device rule: a tensor off the CPU is refused, never rerouted.

The C kernels read raw CPU memory. Falling back to the pure-torch aligned op for a tensor on
another device would silently break bitwise parity wherever the native bits differ from that op's
(the GEMMs, attention, the scan, rms_norm, gated_rms_norm, conv with silu, silu experts): an engine
on another device and a trainer on the CPU would compute different functions. rope's bits equal the
aligned rope's, yet it refuses too, so whether a call is refused depends on the set alone and never
on which op a model happens to call. Dtype- and shape-based fallbacks to the aligned op stay: they
take the same route on every device, so both sides still run one function.
"""

from __future__ import annotations

import torch

#: where the native ops allocate their outputs (explicitly: a default device of "meta" or "cuda"
#: would hand the C code a pointer it cannot write). A device object, not the string "cpu", which
#: torch parses on every call (~0.2 us of a one-row call)
CPU = torch.device("cpu")

#: the one error every native op raises for a tensor off the CPU
CPU_ONLY = "the aligned-native kernels run on the CPU only (got a tensor on another device)"


def require_cpu(*tensors: torch.Tensor | None) -> None:
    """Raise ``ValueError(CPU_ONLY)`` when any given tensor (None skipped) is not on the CPU."""
    for t in tensors:
        if t is not None and not t.is_cpu:
            raise ValueError(CPU_ONLY)
