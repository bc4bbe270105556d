"""``host_reads_for_checks()``: marks kernel and model code that reads tensor data on the host only
to validate it (and raise), so a step-graph capture (``step_graph.py``) accepts the read. Any
other host read during a capture refuses it: its value would be replayed as a constant. A replay
does not repeat the marked checks. (Its own module: the native kernels import it, and step_graph.py
imports them.)"""

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


def reading_for_checks() -> bool:
    return getattr(_checks, "depth", 0) > 0
