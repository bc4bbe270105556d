"""``zm info``: versions, kernel sets and hardware, as JSON or a table."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("info", help="print versions, available kernel sets and hardware")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
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
