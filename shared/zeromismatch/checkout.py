"""Which checkout a command works in: ``results/``, ``runs/`` and ``cluster/profiles/`` live there.

One rule for every command: the checkout is the git top-level of the script being run, when that
script is part of a checkout and says so (``experiments/<name>/launch.py`` through its configs,
``scripts/*.py``, ``paper_figures/make_all.py``: :func:`use_checkout`), else the git top-level of
the current working directory. It is never where the ``zeromismatch`` package was imported from:
an editable install from clone A used from clone B would otherwise judge and overwrite A's data
with B's configs, and a non-editable install would put results inside ``site-packages``.

A git top-level counts as a checkout only when it holds ``experiments/`` and ``results/published/``
(so a command run inside some other repository does not write there). Outside any checkout, a
command needs an explicit path (``--results``, ``--out-root``); without one it gets one
:class:`NoCheckoutError` naming what to pass.
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

MARKERS = ("experiments", "results/published")  # directories every checkout of this project holds

_IN_USE: Path | None = None  # set by the entry point being run (use_checkout), else the cwd decides


class NoCheckoutError(ValueError):
    """No checkout to resolve a default path in; the message says which explicit option to pass."""


def git_toplevel(path: str | os.PathLike) -> Path | None:
    """The git top-level of the work tree holding ``path`` (a file or a directory), or None."""
    where = Path(path).resolve()
    while not where.is_dir():  # a file, or a path not made yet: ask from its nearest existing parent
        if where.parent == where:
            return None
        where = where.parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=where, capture_output=True, text=True,
            timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    top = out.stdout.strip()
    return Path(top).resolve() if top else None


def find_checkout(anchor: str | os.PathLike) -> Path | None:
    """The checkout holding ``anchor`` (its git top-level, if that has the project's markers)."""
    top = git_toplevel(anchor)
    if top is None or not all((top / marker).is_dir() for marker in MARKERS):
        return None
    return top


def checkout_root(what: str = "this command") -> Path:
    """The checkout in use: the one an entry point chose (:func:`use_checkout`), else the cwd's.

    ``what`` names the option that would make the checkout unnecessary, for the error message."""
    if _IN_USE is not None:
        return _IN_USE
    found = find_checkout(Path.cwd())
    if found is None:
        raise NoCheckoutError(
            f"not inside a zeromismatch checkout (cwd {Path.cwd()} is in no git work tree holding "
            f"{' and '.join(m + '/' for m in MARKERS)}): run it from a clone, or pass {what}"
        )
    return found


def use_checkout(anchor: str | os.PathLike) -> Path:
    """Make the checkout holding ``anchor`` (a script's ``__file__``) the one in use for this process.

    NoCheckoutError when ``anchor`` is in none: a script copied out of its checkout must say where
    its outputs go rather than silently write into whatever checkout the cwd is in."""
    global _IN_USE
    found = find_checkout(anchor)
    if found is None:
        raise NoCheckoutError(
            f"{anchor} is not inside a zeromismatch checkout (no git work tree holding "
            f"{' and '.join(m + '/' for m in MARKERS)})"
        )
    _IN_USE = found
    return found


@contextmanager
def checkout_in_use(root: Path | None):
    """Run a block with ``root`` as the checkout in use (None: leave it as it is); restored after,
    so an in-process caller (a test) does not carry a launcher's checkout into later work."""
    global _IN_USE
    previous = _IN_USE
    if root is not None:
        _IN_USE = root
    try:
        yield
    finally:
        _IN_USE = previous


def results_root(explicit: str | os.PathLike | None = None) -> Path:
    """``explicit`` (a ``--results`` value) if given, else ``<checkout>/results``."""
    if explicit is not None:
        return Path(explicit)
    return checkout_root("--results DIR") / "results"


def inside_results(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies under the ``results/`` of the checkout holding it (smoke runs must not:
    ``results/`` holds what the audit judges and ``make reproduce`` verifies)."""
    target = Path(path).resolve()
    top = find_checkout(target)
    return top is not None and target.is_relative_to(top / "results")
