"""``zm bench <name>``: run a benchmark from the repository's benchmarks/ (``BENCHMARKS``).

Each benchmark measures aligned and baseline side by side in one run and prints medians and
their ratio (``alignment_cost``: aligned-native ÷ fast-native over a grid; ``rollout_breakdown``:
where an engine step's time goes, against the 3x-HF budget);
extra arguments are passed through (``zm bench rollout -- --repeats 3``). Nothing is
written unless ``--out`` is passed through (``zm bench ops -- --out /tmp/ops.json``); ``make bench``
writes the committed ``results/reproduced/benchmarks/*.json``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = ("ops", "rollout", "rollout_breakdown", "alignment_cost", "trainer_step", "rl_step", "async")


def _root() -> Path:
    """The checkout the command runs in (its benchmarks/), not the one the package was imported from."""
    from ..checkout import checkout_root

    return checkout_root("nothing else: zm bench runs the benchmarks/ of a source checkout")


def register(sub) -> None:
    p = sub.add_parser("bench", help="run a ratio benchmark (aligned vs fast, vs HF, async vs sync)")
    p.add_argument("name", choices=BENCHMARKS)
    p.add_argument("args", nargs="*", help="passed to the benchmark script (put them after --)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..checkout import NoCheckoutError

    try:
        root = _root()
    except NoCheckoutError as err:
        print(f"zm bench: {err}", file=sys.stderr)
        return 2
    script = root / "benchmarks" / f"{args.name}.py"
    if not script.exists():
        print(f"zm bench: {script} not found (zm bench runs from a source checkout)", file=sys.stderr)
        return 2
    return subprocess.run([sys.executable, str(script), *args.args], cwd=root).returncode
