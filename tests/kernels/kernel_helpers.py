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
