"""Host reads of tensor data that a step-graph capture (``record_replay.py``) may accept. Any other host
read during a capture refuses it, because its value would be replayed as a constant.

- ``host_reads_for_checks()``: reads that only validate inputs (and raise). A replay skips them,
  so its caller must hand it inputs that would pass (the engine builds them itself).
- ``host_reads_of_graph_constants()``: reads of tensors that a graph's key fixes, so their values
  are the same at every replay of that graph: the sampler's per-row temperature / top-k / top-p,
  which the engine's key holds by value (engine/step_graphs.py).

(Its own module: the native kernels import it, and record_replay.py imports them.)"""

from __future__ import annotations

import contextlib
import threading

_checks = threading.local()


@contextlib.contextmanager
def host_reads_for_checks():
    """Host reads inside this block only check inputs; a capture accepts them."""
    _checks.depth = getattr(_checks, "depth", 0) + 1
    try:
        yield
    finally:
        _checks.depth -= 1


@contextlib.contextmanager
def host_reads_of_graph_constants():
    """Host reads inside this block read tensors a graph's key fixes; a capture accepts them."""
    with host_reads_for_checks():
        yield


def reading_for_checks() -> bool:
    return getattr(_checks, "depth", 0) > 0
