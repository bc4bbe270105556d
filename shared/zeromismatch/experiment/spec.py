"""Typed experiment specifications: arms per scale, and the published full-scale set-up."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..rl.config import RLConfig

#: full-smoke: the smoke arms on the full tier's code path (experiment/full.py::run_full_smoke)
SCALES = ("smoke", "mini", "full-smoke", "full")


@dataclass(frozen=True)
class Arm:
    """One arm of an experiment; ``name`` becomes its run directory and the audit's arm name.

    ``seeds`` empty: one run, ``<name>/``, with ``config.seed``. Otherwise one run per seed,
    ``<name>/seed<k>/`` with ``config.seed = k`` (the audit's seeded-arm layout; a claim combines
    them with ``over_seeds``). With a shared warm start every seed starts from the same weights."""

    name: str
    config: RLConfig
    note: str = ""
    seeds: tuple[int, ...] = ()

    def runs(self) -> list[tuple[str, RLConfig]]:
        """(run directory relative to the scale directory, config) of each run of this arm."""
        if not self.seeds:
            return [(self.name, self.config)]
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"arm {self.name}: seeds repeat: {self.seeds}")
        return [(f"{self.name}/seed{seed}", self.config.replace(seed=seed)) for seed in self.seeds]


#: the environments of the published runs, by the name a full-scale config carries, with what each is
#: in the sources' words (docs/sources.md). None is built: the project's envs (``envs/``) are small
#: stand-ins for them.
PUBLISHED_ENVS = {
    "python-tools": "agentic tool use with Python tools, 16K context (S3)",
    "math-reasoning": "math reasoning RL, dataset not named (S1, S2)",
    "math-reasoning-aime24": "math reasoning, evaluated by online AIME24 pass@1 (S3)",
    "tool-use-tasks": "tool-use tasks, scored by macro pass@1 (S3)",
    "osworld": "OSWorld (S3)",
    "swe-bench-pro": "SWE-bench Pro (S1)",
}
#: what a mini arm sizes for a tiny model on a laptop and a full run must size from its publication
FULL_SIZE_FIELDS = ("lr", "group_size", "prompts_per_step", "max_new_tokens")


@dataclass(frozen=True)
class FullScale:
    """The published configuration, as far as the sources state it. ``None`` = not published;
    ``assumed`` lists the fields we had to choose ourselves for the dry-run scripts. ``env`` names a
    ``PUBLISHED_ENVS`` entry; ``sizes`` holds the ``FULL_SIZE_FIELDS`` the source states."""

    model: str
    rollout_engine: str
    trainer: str
    gpus: int | None
    nodes: int
    updates: int | None
    env: str
    lag: int | None = None
    context_tokens: int | None = None
    precision: str | None = None
    source: str = ""
    assumed: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.env not in PUBLISHED_ENVS:
            raise ValueError(
                f"FullScale.env {self.env!r} is not one of PUBLISHED_ENVS {sorted(PUBLISHED_ENVS)}"
            )
        unknown = sorted(set(self.sizes) - set(FULL_SIZE_FIELDS))
        if unknown:
            raise ValueError(f"FullScale.sizes: {unknown} are not among FULL_SIZE_FIELDS {FULL_SIZE_FIELDS}")


@dataclass(frozen=True)
class Experiment:
    name: str
    claim: str  # one line: what the experiment tests
    arms: dict[str, Callable[[], list[Arm]]]  # scale -> named config function
    full: FullScale
    # derive cross-arm results once every arm of a scale has run: f(scale_dir) -> None
    postprocess: Callable[[Path], None] | None = None
    # arms whose published counterpart is another run of the source (another model, env or scale):
    # mini arm name -> that run's set-up; every other arm uses ``full``
    full_by_arm: dict[str, FullScale] = field(default_factory=dict)

    def full_for(self, arm_name: str) -> FullScale:
        """The published set-up a mini arm stands in for."""
        return self.full_by_arm.get(arm_name, self.full)

    def arms_for(self, scale: str) -> list[Arm]:
        if scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
        if scale == "full":
            raise ValueError(
                "full scale runs on the GPU cluster; see launch.py --scale full --cluster slurm --dry-run"
            )
        if scale == "full-smoke":
            raise ValueError("full-smoke arms are the smoke arms on the full tier's path: full_smoke_arms()")
        if scale not in self.arms:
            raise ValueError(f"{self.name} has no {scale!r} configuration (has {sorted(self.arms)})")
        arms = self.arms[scale]()
        names = [arm.name for arm in arms]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}/{scale}: arm names repeat: {names}")
        return arms


def read_records(run_dir: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def tail_mean(records: list[dict], key: str, fraction: float = 0.2) -> float:
    """Mean of the last ``fraction`` of steps; NaN when one of them is not finite (an inf step, a token
    the trainer gives probability 0, would otherwise decide the mean, and a claim compared on it)."""
    values = [r[key] for r in records]
    tail = values[-max(1, int(len(values) * fraction)) :]
    if not all(math.isfinite(value) for value in tail):
        return math.nan
    return sum(tail) / len(tail)


def add_to_summary(run_dir: Path, values: dict, inputs: tuple[Path, ...] = ()) -> None:
    """Merge derived values into a finished run's summary.json (atomically), with their provenance.

    A postprocess may run at a later commit than the run it writes into, and may read other runs:
    ``summary["derived_provenance"][key]`` records the commit that computed each value and the
    commit of every input run (``inputs``: run directories), so the audit can tell whether the
    numbers it compares come from one commit. The run's manifest.json is then rewritten to cover
    the new summary."""
    import json

    from .._provenance import git_commit
    from ..io import atomic_write_json
    from ..manifest import write_manifest

    def commit_of(directory: Path) -> str | None:
        provenance = directory / "provenance.json"
        return json.loads(provenance.read_text()).get("git_commit") if provenance.is_file() else None

    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary.update(values)
    record = {"git_commit": git_commit(), "inputs": {str(p.name): commit_of(p) for p in inputs}}
    derived = summary.setdefault("derived_provenance", {})
    derived.update(dict.fromkeys(values, record))
    atomic_write_json(path, summary)
    write_manifest(run_dir)


def load_experiment_configs(experiment_dir: str | Path):
    """``experiments/<name>/configs.py`` imported as its ``launch.py`` imports it (its folder on
    ``sys.path`` while it runs); the module, which must define ``EXPERIMENT``."""
    import importlib.util
    import sys

    experiment_dir = Path(experiment_dir)
    path = experiment_dir / "configs.py"
    spec = importlib.util.spec_from_file_location(f"_experiment_configs_{experiment_dir.name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(experiment_dir))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(experiment_dir))
    if not hasattr(module, "EXPERIMENT"):
        raise ValueError(f"{path}: defines no EXPERIMENT")
    return module
