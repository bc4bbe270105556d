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


def device_or_exit(parser: argparse.ArgumentParser, text: str):
    """The torch device named by ``--device``, or ``parser.error`` for a bad name or a CUDA device
    torch cannot see."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError as err:
        parser.error(f"bad --device {text!r}: {err}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {text} but torch sees no CUDA device")
    return device
