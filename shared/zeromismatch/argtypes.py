"""argparse value types shared by the command-line scripts (``benchmarks/*.py``): bad values exit 2
with one message before any work is done."""

from __future__ import annotations

import argparse
import math


def int_at_least_or_none(minimum: int):
    """argparse type: an int >= ``minimum``, or ``none`` (any case) for None."""
    parse_int = int_at_least(minimum)

    def parse(text: str) -> int | None:
        return None if text.strip().lower() == "none" else parse_int(text)

    return parse


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


def float_at_least(minimum: float):
    """argparse type: a finite float >= ``minimum``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"must be a finite number >= {minimum}, got {text}")
        return value

    return parse


def check_out_or_exit(parser: argparse.ArgumentParser, out: str) -> None:
    """``parser.error`` (exit 2) when the ``--out`` file could not be written: checked right after
    parsing, so a bad path never costs a measurement that already ran. Empty ``out``: print only."""
    if not out:
        return
    from .io import check_file_path

    try:
        check_file_path(out, "--out")
    except ValueError as err:
        parser.error(str(err))


def parse_device(text: str):
    """The torch device ``text`` names, once checked that a tensor can live there; ValueError naming
    ``--device`` otherwise (an unknown name, ``meta`` or another backend, a CUDA device torch cannot see)."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError as err:
        raise ValueError(f"bad --device {text!r}: {err}") from None
    if device.type not in ("cpu", "cuda"):  # meta runs nothing; other backends are not supported
        raise ValueError(f"bad --device {text!r}: choose cpu or cuda[:index]")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"--device {text} but torch sees no CUDA device")
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"bad --device {text!r}: torch sees {count} CUDA device(s), indices 0..{count - 1}"
            )
    try:
        torch.empty(1, device=device)
    except Exception as err:  # whatever the backend raises, the user's fix is another --device
        raise ValueError(f"bad --device {text!r}: {type(err).__name__}: {str(err).splitlines()[0]}") from None
    return device


def device_or_exit(parser: argparse.ArgumentParser, text: str):
    """:func:`parse_device`, with ``parser.error`` (exit 2) for a bad ``--device``."""
    try:
        return parse_device(text)
    except ValueError as err:
        parser.error(str(err))
