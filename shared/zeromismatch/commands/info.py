"""``zm info``: versions, kernel sets and hardware, as JSON or a table; ``--ops``: which function
computes each op of each kernel set.

The sets are built from modules (``kernels/_modules.py``), so go-to-definition on ``kernels.attention``
lands on the abstract ``KernelSet``; this table names the function that really runs.

    zm info --ops --kernels aligned-native
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("info", help="print versions, available kernel sets and hardware")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--ops", action="store_true", help="the function behind every op of each kernel set")
    p.add_argument("--kernels", nargs="+", default=None, metavar="SET", help="with --ops: only these sets")
    p.set_defaults(func=run)


def op_table(name: str) -> dict[str, str]:
    """op -> ``module.function`` that computes it in kernel set ``name`` (building the set: a native
    set compiles on first use)."""
    from ..kernels import get_kernels
    from ..kernels.base import KernelSet

    kernels = get_kernels(name)
    table = {}
    for op in sorted(KernelSet.__abstractmethods__):
        fn = getattr(type(kernels), op)
        fn = getattr(fn, "__func__", fn)
        table[op] = f"{fn.__module__}.{fn.__qualname__}"
    return table


def _run_ops(args) -> int:
    from ..kernels import available_kernels

    known = available_kernels()
    names = args.kernels or known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--kernels: unknown kernel set(s) {unknown}; known: {', '.join(known)}")
    tables = {name: op_table(name) for name in names}
    if args.json:
        print(json.dumps(tables, indent=2, sort_keys=True))
        return 0
    for name, table in tables.items():
        print(f"[{name}]")
        for op, where in table.items():
            print(f"  {op:22s} {where}")
    return 0


def run(args) -> int:
    if args.kernels and not args.ops:
        print("zm info: --kernels goes with --ops", file=sys.stderr)
        return 2
    if args.ops:
        try:
            return _run_ops(args)
        except ValueError as err:
            print(f"zm info: {err}", file=sys.stderr)
            return 2
    from .._provenance import provenance
    from ..kernels import available_kernels

    info = provenance(argv=[])
    info.pop("command_line", None)
    info.pop("config_hash", None)
    info["kernel_sets"] = available_kernels()
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    for key, value in info.items():
        print(f"{key:22s} {value}")
    return 0
