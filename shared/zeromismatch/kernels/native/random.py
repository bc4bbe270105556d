"""The sampler's uniform noise in C (random.c): torch's CPU generator stream, bit for bit.

The engine's sampler gives every request its own stream: for each sampled row it seeds a
``torch.Generator`` with ``mix_seed(request seed, token index)`` and fills a vocab-sized row with
``uniform_`` (engine/sampler.py), two torch calls and some Python per row. ``random.c`` runs the
same MT19937 recurrence, twist, tempering and 24-bit conversion for 16 rows at once: the same bits
for every seed and length (tests compare it with ``torch.Generator``). For 32 rows of 512 it
measured 14 us against 244 us for the loop in one run and 21 against 128 us in a review's (6-18x,
with the machine's load).

Kernel-set independent: the sampler of every set uses it when the native library builds here
and falls back to the torch loop otherwise (the same bits either way). The first draw of a
process builds (or loads) the library; a failed build is remembered, not retried per step.
"""

from __future__ import annotations

import torch

from . import _build
from ._device import CPU

#: why the library did not build, once it failed (the sampler then keeps its torch loop; no retry
#: per step)
_failed: str | None = None


def _library():
    global _failed
    if _failed is not None:
        return None
    try:
        return _build.library()
    except _build.NativeBuildError as err:
        _failed = str(err)
        return None


def available() -> bool:
    """Whether the noise comes from random.c here (else the sampler's torch loop draws it)."""
    return _library() is not None


def seed_tensor(seeds: list[int]) -> torch.Tensor:
    """``seeds`` (each in [0, 2^64), as ``manual_seed`` takes them) as an int64 tensor holding their
    uint64 bits, the form ``uniform_rows_from`` reads."""
    bad = [s for s in seeds if not 0 <= s < 1 << 64]
    if bad:
        raise ValueError(f"generator seeds must lie in [0, 2^64), got {bad[:3]}")
    return torch.tensor([s - (1 << 64) if s >= 1 << 63 else s for s in seeds], dtype=torch.int64)


def uniform_rows_from(seeds: torch.Tensor, cols: int) -> torch.Tensor | None:
    """``uniform_rows`` for seeds already in a contiguous int64 CPU tensor (``seed_tensor``): what a
    step graph replays, reading the seeds from memory (kernels/step_graph.py)."""
    library = _library()
    if library is None:
        return None
    if seeds.dtype != torch.int64 or seeds.dim() != 1 or not seeds.is_contiguous() or seeds.device != CPU:
        what = f"{seeds.dtype} {tuple(seeds.shape)}"
        raise ValueError(f"seeds must be a contiguous 1-D int64 CPU tensor, got {what}")
    out = torch.empty(seeds.shape[0], cols, dtype=torch.float32, device=CPU)
    if out.numel():
        library.zm_uniform_rows(seeds.data_ptr(), seeds.shape[0], cols, out.data_ptr())
    return out


def race_argmax(processed: torch.Tensor, log_e: torch.Tensor) -> torch.Tensor | None:
    """``torch.argmax(processed - log_e, dim=1)`` (the sampler's race) in one native pass, the same
    indices (random.c states the rule); None where the native library does not build here or the
    operands are not contiguous fp32 CPU ``[rows, cols]`` tensors of one shape (the caller runs torch)."""
    library = _library()
    tensors = (processed, log_e)
    if library is None or any(
        t.dtype != torch.float32 or t.device != CPU or not t.is_contiguous() for t in tensors
    ):
        return None
    if processed.dim() != 2 or processed.shape != log_e.shape or processed.shape[1] == 0:
        return None
    tokens = torch.empty(processed.shape[0], dtype=torch.int64, device=CPU)
    library.zm_race_argmax(
        processed.data_ptr(), log_e.data_ptr(), processed.shape[0], processed.shape[1], tokens.data_ptr()
    )
    return tokens


def uniform_rows(seeds: list[int], cols: int) -> torch.Tensor | None:
    """fp32 ``[len(seeds), cols]``: row r is ``torch.Generator().manual_seed(seeds[r])``'s first
    ``cols`` draws of ``uniform_``; None when the native library does not build here. Seeds are
    non-negative and below 2^64 (as ``manual_seed`` takes them)."""
    if _library() is None:
        return None
    return uniform_rows_from(seed_tensor(seeds), cols)
