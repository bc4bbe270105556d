"""argparse value types shared by the command-line scripts (``benchmarks/*.py``): bad values exit 2
with one message before any work is done."""

from __future__ import annotations

import argparse


def int_at_least(minimum: int):
    """argparse type: an int >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse
