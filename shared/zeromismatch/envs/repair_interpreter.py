"""The interpreter both code_repair variants run patched functions with: operator tables, the range
fold, and the unit-test loop. Nothing a model writes is executed: a patch only selects slot values."""

from __future__ import annotations

import operator

ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul}
COMPARE = {">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le, "==": operator.eq,
           "!=": operator.ne}  # fmt: skip


def range_fold(slots: dict[str, str], args: tuple, accumulator: str) -> int:
    """``value = slots[accumulator]; for i in range(start, n + end): value = value <op> i``."""
    (n,) = args
    value = int(slots[accumulator])
    for i in range(int(slots["start"]), n + int(slots["end"])):
        value = ARITH[slots["op"]](value, i)
    return value


def run_tests(template, slots: dict[str, str], tests: list[tuple[tuple, object]]) -> int:
    """How many (args, expected) tests the slot assignment passes (``template``: either variant's,
    anything with ``run(slots, args)``)."""
    passed = 0
    for args, expected in tests:
        try:
            passed += template.run(slots, args) == expected
        except (IndexError, ZeroDivisionError, OverflowError):
            pass
    return passed
