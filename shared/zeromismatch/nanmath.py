"""Plain-float helpers that follow the project's rule for non-finite values (torch-free: the audit
imports them as well as the training loop)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def max_nan_wins(values: Iterable[float]) -> float | None:
    """The largest value; nan if any is nan (a blow-up or an unmeasured value must show: Python's
    ``max`` keeps a nan only when it comes first); None for no values."""
    values = list(values)
    if any(v != v for v in values):  # (nan is the one value unequal to itself; None and ints pass)
        return math.nan
    return max(values) if values else None
