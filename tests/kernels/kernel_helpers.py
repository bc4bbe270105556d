"""Helpers shared by the kernel test modules (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block with ``n`` torch threads, then restore the previous count."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


#: the activation dtypes the native tests cover, by the names hypothesis and ids print
NAMED_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def scaled_randn(gen: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    """Standard-normal values from ``gen`` times ``scale``, then cast to ``dtype``."""
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)
