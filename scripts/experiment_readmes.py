"""Regenerate every ``experiments/<name>/README.md`` from that experiment's ``configs.py``.

Nothing in a README is typed by hand: the title is the experiment's name, the opening paragraphs are
the module docstring of ``configs.py``, the claim line is ``EXPERIMENT.claim``, the arms table is
computed from the mini arms' ``RLConfig`` objects, and the published set-up is ``EXPERIMENT.full``
(a ``FullScale``).

The arms section: a field whose value is the same in every mini arm goes on the "Base configuration"
line (the core run-size fields always, any other field only when it is not the ``RLConfig`` default).
A field that varies but has one value in a strict majority of the arms goes on an "unless its row says
otherwise" line with that value (same display rule), so one odd arm -- another env, say -- does not
push every field it changes into every row. Each arm's "differs from the base" cell then lists, as
``field=value``, every varying field where the arm does not have that majority value: the base lines
plus a row give the arm's whole configuration (up to RLConfig defaults).

configs.py is loaded the way ``tests/experiments/test_experiments.py`` loads it (importlib from the
file path), so a README renders whatever the config holds at that moment. The default writes each
README atomically (only those whose text changed); ``--check`` writes nothing and exits 1 listing the
READMEs that are out of date. ``tests/experiments/test_readmes.py`` fails when one is.

    python scripts/experiment_readmes.py [--check] [--quiet]
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python scripts/experiment_readmes.py"

# The fields that say what a run is (policy, task, algorithm, kernels) and how big it is, in display
# order; the rest of RLConfig follows in dataclass order. Shown whenever the arms share them, defaults
# included, except the sampling fields, which (like every other field) appear only when not the default.
DISPLAY_ORDER = (
    "model", "env", "env_options", "algo", "kernels", "lag", "steps", "prompts_per_step", "group_size",
    "max_new_tokens", "sft_steps", "sft_batch", "sft_lr", "lr", "temperature", "top_p", "eval_size",
    "eval_samples", "seed",
)  # fmt: skip
CORE_FIELDS = tuple(name for name in DISPLAY_ORDER if name not in ("temperature", "top_p"))
PAIRED = ("prompts_per_step", "group_size")

MINI_CAVEAT = (
    "Mini results are CPU runs of tiny models: they show whether an effect appears, never the published "
    "magnitude."
)
GPU_NOTE = (
    "The full tier's job (a vLLM rollout actor and a Megatron-core learner under Ray, launched by "
    "submitit on Slurm) runs here at smoke size with `--scale full-smoke` (see "
    "[`cluster/README.md`](../../cluster/README.md)). A real `--scale full` submission is refused before "
    "anything is submitted, naming each piece not built yet; the dry run shows exactly what would run. "
    "Each resolved config's `source_of` says, per value, whether the source states it, we assumed it, or "
    "the mini arm carries it over (its loss, lag and sampling: the experiment's design, not the "
    "publication's); the kernel set and dtype are the GPU tier's counterparts of the mini arm's."
)


def discover(root: Path = ROOT) -> list[str]:
    """Names of the experiment folders that have a configs.py, sorted."""
    return sorted(p.parent.name for p in (root / "experiments").glob("*/configs.py"))


def load_configs(name: str, root: Path = ROOT) -> ModuleType:
    from zeromismatch.experiment.spec import load_experiment_configs

    return load_experiment_configs(root / "experiments" / name)


# ---------------------------------------------------------------------------------------- arms


def _field_order() -> list[str]:
    from zeromismatch.rl import RLConfig

    return [*DISPLAY_ORDER, *(f.name for f in dataclasses.fields(RLConfig) if f.name not in DISPLAY_ORDER)]


def _defaults() -> dict[str, Any]:
    from zeromismatch.rl import RLConfig

    return RLConfig().to_dict()


def common_base(arms: list) -> dict[str, Any]:
    """The config fields whose value is the same in every arm, in display order."""
    if not arms:
        raise ValueError("common_base: no arms")
    configs = [arm.config.to_dict() for arm in arms]
    return {
        name: configs[0][name] for name in _field_order() if all(c[name] == configs[0][name] for c in configs)
    }


def usual_values(arms: list) -> dict[str, Any]:
    """For each field that varies across the arms, the value a strict majority of them share (if any).

    Without this a single odd arm (say, another env) would push every field it changes into every
    row; with it, rows list departures from what most arms do. Two arms that disagree have no majority,
    so both rows then show their own value."""
    base = common_base(arms)
    configs = [arm.config.to_dict() for arm in arms]
    usual = {}
    for name in _field_order():
        if name in base:
            continue
        values = [c[name] for c in configs]  # dicts are unhashable: count by equality
        for value in values:
            if 2 * sum(v == value for v in values) > len(values):
                usual[name] = value
                break
    return usual


def arm_differences(arms: list) -> dict[str, dict[str, Any]]:
    """Per arm name, the fields where that arm departs from the base: every field not common to all
    arms, except those where the arm has the majority value (``usual_values``), in display order."""
    base, usual = common_base(arms), usual_values(arms)
    differences = {}
    for arm in arms:
        config = arm.config.to_dict()
        differences[arm.name] = {
            name: config[name]
            for name in _field_order()
            if name not in base and not (name in usual and config[name] == usual[name])
        }
    return differences


def render_value(value: Any) -> str:
    """Python-literal style, except strings at the top level are bare (``kernels=aligned``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value)
    return repr(value)


def _code(text: str) -> str:
    return f"`{text}`"


def render_assignments(values: dict[str, Any]) -> list[str]:
    """``field=value`` items in code spans; the prompts x samples pair joins into one item."""
    items = []
    for name, value in values.items():
        if name == PAIRED[1] and PAIRED[0] in values:
            continue
        item = _code(f"{name}={render_value(value)}")
        if name == PAIRED[0] and PAIRED[1] in values:
            item += " x " + _code(f"{PAIRED[1]}={render_value(values[PAIRED[1]])}")
        items.append(item)
    return items


def _worth_showing(values: dict[str, Any]) -> dict[str, Any]:
    """Core fields always; any other field only when it is not the RLConfig default."""
    defaults = _defaults()
    return {name: v for name, v in values.items() if name in CORE_FIELDS or v != defaults[name]}


def base_line(arms: list) -> str:
    shared = ", ".join(render_assignments(_worth_showing(common_base(arms))))
    if len(arms) == 1:
        return f"Configuration of the only arm: {shared}."
    text = f"Base configuration, shared by every arm: {shared}."
    usual = _worth_showing(usual_values(arms))
    if usual:
        text += (
            " Unless its row says otherwise, an arm also has (the setting most arms share): "
            f"{', '.join(render_assignments(usual))}."
        )
    return text + " The last column lists what each arm sets otherwise."


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def arms_table(arms: list) -> list[str]:
    differences = arm_differences(arms)
    lines = ["| arm | seeds | note | differs from the base |", "|---|---|---|---|"]
    for arm in arms:
        differs = ", ".join(render_assignments(differences[arm.name])) or "—"
        # a seeded arm is one run per seed, <arm>/seed<k>/, each with config.seed = k
        seeds = ", ".join(str(seed) for seed in arm.seeds) if arm.seeds else str(arm.config.seed)
        lines.append(f"| {_code(arm.name)} | {seeds} | {_cell(arm.note) or '—'} | {_cell(differs)} |")
    return lines


# ------------------------------------------------------------------------------ published set-up


def _figures(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{key} {_figures(item)}" for key, item in value.items())
    return render_value(value)


def published_setup(full) -> list[str]:
    from zeromismatch.experiment.spec import FULL_SIZE_FIELDS, PUBLISHED_ENVS

    scale = [
        f"GPUs: {'not stated in the source' if full.gpus is None else full.gpus}",
        f"nodes: {full.nodes}",
        f"updates: {'not stated' if full.updates is None else full.updates}",
        f"env: `{full.env}` ({PUBLISHED_ENVS[full.env]})",
    ]
    if full.precision is not None:
        scale.append(f"precision {full.precision}")
    if full.lag is not None:
        scale.append(f"lag {full.lag}")
    if full.context_tokens is not None:
        scale.append(f"context {full.context_tokens} tokens")
    source = full.source or "not recorded"
    stated = ", ".join(f"{key} {value}" for key, value in full.sizes.items()) or "none"
    unstated = ", ".join(key for key in FULL_SIZE_FIELDS if key not in full.sizes) or "none"
    lines = [
        f"- model: {full.model}; rollout: {full.rollout_engine}; trainer: {full.trainer}",
        f"- {'; '.join(scale)}",
        f"- source: {source} (see [`docs/sources.md`](../../docs/sources.md))",
        f"- chosen by us for the dry-run scripts (not published): {', '.join(full.assumed) or 'nothing'}",
        f"- run sizes stated: {stated}; not stated (to set before a real run): {unstated}",
    ]
    if full.extra:
        figures = "; ".join(f"{key} ({_figures(value)})" for key, value in full.extra.items())
        lines.append(f"- other published figures: {figures}")
    return lines


def published_setup_by_arm(experiment) -> list[str]:
    """The experiment's published set-up, then each other published run some arms stand in for."""
    others: dict[int, tuple[object, list[str]]] = {}
    for arm, full in experiment.full_by_arm.items():
        others.setdefault(id(full), (full, []))[1].append(arm)
    if not others:
        return published_setup(experiment.full)
    covered = {arm for _, arms in others.values() for arm in arms}
    rest = [arm.name for arm in experiment.arms_for("mini") if arm.name not in covered]
    lines = [_arms_label(rest), "", *published_setup(experiment.full)]
    for full, arms in others.values():
        lines += ["", _arms_label(arms), "", *published_setup(full)]
    return lines


def _arms_label(arms: list[str]) -> str:
    return f"{'Arm' if len(arms) == 1 else 'Arms'} {', '.join(f'`{a}`' for a in arms)}:"


# ------------------------------------------------------------------------------------ the README


def run_it(name: str, full_smoke: bool = True) -> list[str]:
    """The launch commands; ``full_smoke``: whether any smoke arm can run on the full tier's path."""
    commands = [
        (f"python experiments/{name}/launch.py --scale smoke", "seconds"),
        (
            f"python experiments/{name}/launch.py --scale mini",
            f"CPU minutes -> results/reproduced/{name}/mini/",
        ),
        *(
            [
                (
                    f".venv-vllm/bin/python experiments/{name}/launch.py --scale full-smoke --cluster slurm",
                    f"the full tier's path at smoke size -> runs/{name}/full-smoke/",
                )
            ]
            if full_smoke
            else []
        ),  # fmt: skip
        (
            f"python experiments/{name}/launch.py --scale full --cluster slurm --dry-run",
            f"sbatch scripts + resolved configs -> runs/full/{name}/",
        ),
        (f"python experiments/{name}/figures.py", "figures + verdicts from results/ only"),
    ]
    width = max(len(command) for command, _ in commands) + 3
    return ["```bash", *(f"{command.ljust(width)}# {comment}" for command, comment in commands), "```"]


def render(module: ModuleType) -> str:
    """The whole README of one experiment, from its loaded configs.py module."""
    from zeromismatch.experiment.full import full_smoke_arms

    experiment = module.EXPERIMENT
    if not module.__doc__:
        raise ValueError(f"{module.__file__}: configs.py has no module docstring to open the README with")
    name = experiment.name
    published = f"results/published/{name}.json"
    arms = experiment.arms_for("mini")
    lines = [
        f"<!-- generated by `{COMMAND}` from configs.py; edit that, not this file -->",
        f"# {name}",
        "",
        inspect.cleandoc(module.__doc__),
        "",
        "## Claims tested",
        "",
        f"In one line: {experiment.claim}. Every published number of this experiment, with its source and "
        f"the rule that judges it, is in [`{published}`](../../{published}); the verdicts are in "
        "[`results/REPORT.md`](../../results/REPORT.md).",
        "",
        "## Arms (mini scale)",
        "",
        f"{base_line(arms)} {MINI_CAVEAT}",
        "",
        *arms_table(arms),
        "",
        "## Run it",
        "",
        *run_it(name, full_smoke=bool(full_smoke_arms(experiment)[0])),
        "",
        "## Published set-up (full scale)",
        "",
        *published_setup_by_arm(experiment),
        "",
        GPU_NOTE,
    ]
    return "\n".join(lines) + "\n"


def render_readme(name: str, root: Path = ROOT) -> str:
    return render(load_configs(name, root))


def main(argv: list[str] | None = None) -> int:
    from zeromismatch.io import atomic_write_text

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any README is stale")
    parser.add_argument("--quiet", action="store_true", help="print only problems")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)  # for the tests
    args = parser.parse_args(argv)
    names = discover(args.root)
    if not names:
        print(f"experiment_readmes: no experiments/*/configs.py under {args.root}", file=sys.stderr)
        return 2
    stale = []
    for name in names:
        path = args.root / "experiments" / name / "README.md"
        try:
            text = render_readme(name, args.root)
        except Exception as err:  # a config mid-edit: name it, keep the traceback's message
            print(f"experiment_readmes: experiments/{name}/configs.py: {err}", file=sys.stderr)
            return 2
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            if not args.quiet:
                print(f"up to date: experiments/{name}/README.md")
            continue
        stale.append(f"experiments/{name}/README.md")
        if not args.check:
            atomic_write_text(path, text)
            if not args.quiet:
                print(f"wrote: experiments/{name}/README.md")
    if args.check and stale:
        print(f"out of date (regenerate with `{COMMAND}`):", *stale, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
