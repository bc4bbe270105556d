"""Named cluster profiles: what a Slurm job asks for (partition, account, nodes, GPUs, CPUs, memory, time).

A profile is a JSON file ``<name>.json`` in the profiles directory, ``cluster/profiles/`` of the
checkout in use (``zeromismatch.checkout``: the launcher's, else the cwd's; never the installed
package's) unless ``ZM_CLUSTER_PROFILES`` names another directory. Code never holds site paths or
site names: the values a site decides (partition, account) may be written as placeholders
``${VAR}`` or ``${VAR:-default}`` that :meth:`ClusterProfile.resolved` fills from the environment.

Validation is strict and names the field at fault: every field below is required, nothing else is
allowed, and types are exact (``true`` is not an integer). The first problem found raises one
``ValueError`` (bad value, unknown or missing field) or ``TypeError`` (wrong type).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

PROFILES_ENV = "ZM_CLUSTER_PROFILES"
_PLACEHOLDER = re.compile(r"^\$\{(?P<var>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}$")
# Slurm names: partitions, accounts, GPU types. Conservative on purpose; a placeholder is also allowed.
_SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_SBATCH_FLAG = re.compile(r"^[a-z][a-z0-9-]*$")


@dataclass(frozen=True)
class ClusterProfile:
    """One validated profile. Defaults for ``submit``; every field can be overridden per job."""

    name: str
    description: str
    partition: str
    account: str | None
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    gpu_type: str | None
    mem_gb: float
    timeout_min: int
    exclusive: bool
    setup: tuple[str, ...] = ()
    sbatch_extra: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["setup"] = list(self.setup)
        data["sbatch_extra"] = dict(self.sbatch_extra)
        return data

    def placeholders(self) -> dict[str, str]:
        """Fields still written as ``${VAR}`` placeholders, as ``{field: VAR}``."""
        found = {}
        for name in _PLACEHOLDER_FIELDS:
            value = getattr(self, name)
            match = _PLACEHOLDER.match(value) if isinstance(value, str) else None
            if match:
                found[name] = match["var"]
        return found

    def resolved(self, environ: Mapping[str, str] | None = None) -> tuple[ClusterProfile, dict[str, str]]:
        """Fill placeholders from ``environ`` (default ``os.environ``).

        Returns the profile with every resolvable placeholder replaced, and ``{field: VAR}`` for
        those that stay unresolved (variable unset and no default); those keep their ``${VAR}`` text.
        """
        environ = os.environ if environ is None else environ
        changes: dict[str, str] = {}
        unresolved: dict[str, str] = {}
        for name in _PLACEHOLDER_FIELDS:
            value = getattr(self, name)
            match = _PLACEHOLDER.match(value) if isinstance(value, str) else None
            if not match:
                continue
            filled = environ.get(match["var"]) or match["default"]
            if not filled:
                unresolved[name] = match["var"]
                continue
            if not _SLURM_NAME.match(filled):
                raise ValueError(
                    f"profile {self.name!r}: field {name!r} came from ${{{match['var']}}} = {filled!r}, "
                    "which is not a valid Slurm name (letters, digits, _ . + -)"
                )
            changes[name] = filled
        return replace(self, **changes), unresolved


_PLACEHOLDER_FIELDS = ("partition", "account")

# field -> (accepted JSON types, description used in errors)
_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "name": ((str,), "a string"),
    "description": ((str,), "a string"),
    "partition": ((str,), "a string"),
    "account": ((str, type(None)), "a string or null"),
    "nodes": ((int,), "an integer"),
    "tasks_per_node": ((int,), "an integer"),
    "cpus_per_task": ((int,), "an integer"),
    "gpus_per_node": ((int,), "an integer"),
    "gpu_type": ((str, type(None)), "a string or null"),
    "mem_gb": ((int, float), "a number"),
    "timeout_min": ((int,), "an integer"),
    "exclusive": ((bool,), "true or false"),
    "setup": ((list,), "a list of shell lines"),
    "sbatch_extra": ((dict,), "an object of sbatch flag -> string value"),
}


def _check_value(where: str, name: str, value: object) -> None:
    """Value checks that hold after the type check passed."""

    def bad(why: str) -> ValueError:
        return ValueError(f"{where}: field {name!r} {why}, got {value!r}")

    if name in ("nodes", "tasks_per_node", "cpus_per_task", "timeout_min") and value < 1:
        raise bad("must be >= 1")
    if name == "gpus_per_node" and value < 0:
        raise bad("must be >= 0")
    # Python's json reads Infinity and NaN; Slurm would get --mem=inf (or the job would crash on it)
    if name == "mem_gb" and not (math.isfinite(value) and value > 0):
        raise bad("must be > 0 and finite")
    if name == "name" and not re.match(r"^[a-z0-9][a-z0-9-]*$", value):
        raise bad("must be lower-case letters, digits and '-'")
    if name in ("partition", "account", "gpu_type") and isinstance(value, str):
        if not (_SLURM_NAME.match(value) or (name != "gpu_type" and _PLACEHOLDER.match(value))):
            raise bad("must be a Slurm name (letters, digits, _ . + -) or a ${VAR} placeholder")
    if name == "setup":
        for line in value:
            if not isinstance(line, str) or "\n" in line:
                raise TypeError(f"{where}: field 'setup' must hold single-line strings, got {line!r}")
    if name == "sbatch_extra":
        for flag, flag_value in value.items():
            if not _SBATCH_FLAG.match(flag):
                raise ValueError(f"{where}: field 'sbatch_extra' has a bad sbatch flag name {flag!r}")
            if not isinstance(flag_value, str) or "\n" in flag_value:
                raise TypeError(
                    f"{where}: field 'sbatch_extra' flag {flag!r} must be a single-line string, "
                    f"got {flag_value!r}"
                )


def profile_from_dict(data: Mapping[str, object], source: str = "<dict>") -> ClusterProfile:
    """Validate ``data`` (the parsed JSON) and build the profile; ``source`` names it in errors."""
    where = f"cluster profile {source}"
    if not isinstance(data, Mapping):
        raise TypeError(f"{where}: must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(_FIELDS)})")
    for name, (types, described) in _FIELDS.items():
        if name not in data:
            raise ValueError(f"{where}: missing field {name!r}")
        value = data[name]
        # bool is an int subclass in Python; JSON true must not pass as a node count.
        if isinstance(value, bool) and bool not in types:
            raise TypeError(f"{where}: field {name!r} must be {described}, got {value!r}")
        if not isinstance(value, types):
            raise TypeError(f"{where}: field {name!r} must be {described}, got {value!r}")
        _check_value(where, name, value)
    values = dict(data)
    values["setup"] = tuple(values["setup"])
    values["sbatch_extra"] = dict(values["sbatch_extra"])
    values["mem_gb"] = float(values["mem_gb"])
    return ClusterProfile(**values)


def profiles_dir() -> Path:
    """``$ZM_CLUSTER_PROFILES`` if set, else ``cluster/profiles`` of the checkout in use
    (NoCheckoutError, a ValueError, outside any checkout)."""
    if os.environ.get(PROFILES_ENV):
        return Path(os.environ[PROFILES_ENV])
    from ..checkout import checkout_root

    return checkout_root(f"${PROFILES_ENV}=DIR") / "cluster" / "profiles"


def list_profiles(directory: str | os.PathLike | None = None) -> list[str]:
    folder = Path(directory) if directory is not None else profiles_dir()
    return sorted(path.stem for path in folder.glob("*.json"))


def load_profile(
    name_or_path: str | os.PathLike, directory: str | os.PathLike | None = None
) -> ClusterProfile:
    """Load a profile by name (``local-cpu``) from the profiles directory, or from a ``.json`` path.

    A file's ``name`` field must equal its file name without ``.json``, so a profile is always
    found under the name it reports.
    """
    text = str(name_or_path)
    if text.endswith(".json") or os.sep in text:
        path = Path(text)
    else:
        folder = Path(directory) if directory is not None else profiles_dir()
        path = folder / f"{text}.json"
        if not path.is_file():
            known = ", ".join(list_profiles(folder)) or "none"
            raise ValueError(f"unknown cluster profile {text!r} in {folder} (known: {known})")
    if not path.is_file():
        raise ValueError(f"cluster profile file {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"cluster profile {path}: not valid JSON ({error})") from error
    profile = profile_from_dict(data, source=str(path))
    if profile.name != path.stem:
        raise ValueError(
            f"cluster profile {path}: field 'name' is {profile.name!r} but the file is {path.stem!r}"
        )
    return profile
