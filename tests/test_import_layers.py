"""The core's layers import one way: kernels <- models <- engine <- train <- rl <- experiment/audit <-
commands. A module may import its own layer and the layers before it, never one after it (at module
level or inside a function). Integrations (vLLM, Megatron) and the top-level helpers sit outside the
chain."""

from __future__ import annotations

import ast
from pathlib import Path

import zeromismatch

ORDER = ("kernels", "models", "engine", "train", "rl", "experiment", "audit", "commands")
SAME_RANK = {"experiment": "audit", "audit": "experiment"}  # the two read each other's results
ROOT = Path(zeromismatch.__file__).resolve().parent


def _imported_modules(source: str, package: str):
    """(line, absolute module name) of every import in ``source``, a module of ``package``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.lineno, node.module or ""
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def upward_imports(source: str, layer: str, package: str) -> list[tuple[int, str]]:
    rank = {name: i for i, name in enumerate(ORDER)}
    found = []
    for line, module in _imported_modules(source, package):
        parts = module.split(".")
        if parts[0] != "zeromismatch" or len(parts) < 2 or parts[1] not in rank:
            continue
        target = parts[1]
        if rank[target] > rank[layer] and SAME_RANK.get(layer) != target:
            found.append((line, module))
    return found


def test_no_module_imports_a_later_layer():
    bad = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if len(parts) < 2 or parts[0] not in ORDER:
            continue
        package = ".".join(("zeromismatch", *parts[:-1]))
        for line, module in upward_imports(path.read_text(encoding="utf-8"), parts[0], package):
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_the_check_sees_an_upward_import():
    """The inverse: a kernel module importing the engine (relative, inside a function) is caught."""
    source = "def f():\n    from ...engine.llm import LLM\n    import zeromismatch.rl.loop\n"
    assert upward_imports(source, "kernels", "zeromismatch.kernels.aligned") == [
        (2, "zeromismatch.engine.llm"),
        (3, "zeromismatch.rl.loop"),
    ]
