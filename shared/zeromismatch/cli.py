"""The ``zm`` command line: ``zm parity | invariance | bisect | bench | train | audit | info``.

Each subcommand lives in ``zeromismatch.commands.<name>`` and exposes
``register(subparsers)``; a command whose optional dependencies are missing
still shows in ``--help`` and fails with one clear message when run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from ._provenance import git_commit

# Order is the order shown in --help. Add a module here when you add a command.
COMMAND_MODULES = ["info", "parity", "invariance", "bisect", "bench", "train", "audit"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zm",
        description="zero train-inference mismatch RL: parity checks, bisection, training, audit",
    )
    parser.add_argument(
        "--version", action="version", version=f"zeromismatch {__version__} (git {git_commit()})"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"zeromismatch.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name and err.name.startswith("zeromismatch.commands"):
                continue  # command not written yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ._provenance import freeze_git_state

    freeze_git_state()  # every record this command writes names the code it started with
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from .kernels.native._build import NativeBuildError

    try:
        return int(args.func(args) or 0)
    except NativeBuildError as err:  # e.g. --kernels aligned-native without a C compiler
        print(f"zm {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `zm audit | head`: the reader left; exit quietly like other Unix tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
