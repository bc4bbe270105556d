"""Typed reads from the JSON files the report's extra sections render (benchmarks, learnability,
portability).

:class:`Node` wraps one value of a parsed file together with the file and the key path that led
to it. Asking a node for a type it does not hold (a number that is a string, an object that is a
list, a key that is absent) raises :class:`AuditInputError` naming the file, the key path and what
was found -- never a bare KeyError or TypeError from deep inside a renderer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .registry import AuditInputError, read_json

_ABSENT = object()


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {value!r}"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value[:40]!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


@dataclass(frozen=True)
class Node:
    """One value of a JSON input file; ``what`` names the file (e.g. "benchmark file /r/ops.json")."""

    value: object
    what: str
    at: str = ""  # key path inside the file, e.g. "cases[3].throughput_ratio"

    @classmethod
    def load(cls, path: Path, what: str) -> Node:
        return cls(read_json(path, what), f"{what} {path}")

    def fail(self, message: str) -> AuditInputError:
        return AuditInputError(f"malformed {self.what}: {self.at or '(top level)'} {message}")

    def _child(self, key: str | int, value: object) -> Node:
        at = f"{self.at}[{key}]" if isinstance(key, int) else (f"{self.at}.{key}" if self.at else key)
        return Node(value, self.what, at)

    def obj(self) -> dict:
        if not isinstance(self.value, dict):
            raise self.fail(f"should be a JSON object, is {_kind(self.value)}")
        return self.value

    def has(self, key: str) -> bool:
        return self.obj().get(key) is not None

    def __getitem__(self, key: str) -> Node:
        value = self.obj().get(key, _ABSENT)
        if value is _ABSENT:
            raise self._child(key, None).fail("is missing")
        return self._child(key, value)

    def get(self, key: str, default: object = None) -> Node:
        """The child, or a node holding ``default`` when the key is absent or null."""
        value = self.obj().get(key)
        return self._child(key, default if value is None else value)

    def items(self) -> list[tuple[str, Node]]:
        return [(key, self._child(key, value)) for key, value in self.obj().items()]

    def list(self) -> list[Node]:
        if not isinstance(self.value, list):
            raise self.fail(f"should be a list, is {_kind(self.value)}")
        return [self._child(index, value) for index, value in enumerate(self.value)]

    def number(self) -> float:
        if isinstance(self.value, bool) or not isinstance(self.value, int | float):
            raise self.fail(f"should be a number, is {_kind(self.value)}")
        return float(self.value)

    def positive(self) -> float:
        """A finite number > 0 (a speed ratio, whose logarithm is averaged)."""
        number = self.number()
        if not (math.isfinite(number) and number > 0):
            raise self.fail(f"should be a finite number > 0, is {number!r}")
        return number

    def integer(self) -> int:
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise self.fail(f"should be an integer, is {_kind(self.value)}")
        return self.value

    def text(self) -> str:
        if not isinstance(self.value, str):
            raise self.fail(f"should be a string, is {_kind(self.value)}")
        return self.value

    def scalar(self) -> str:
        """A string, number or boolean shown as written (names, versions, thread counts)."""
        if isinstance(self.value, dict | list) or self.value is None:
            raise self.fail(f"should be a string or number, is {_kind(self.value)}")
        return str(self.value)

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            raise self.fail(f"should be true or false, is {_kind(self.value)}")
        return self.value

    def provenance(self) -> Node:
        """The file's ``provenance`` object (an empty one when absent)."""
        node = self.get("provenance", {})
        node.obj()
        return node

    def commit(self) -> str | None:
        """``provenance.git_commit`` as recorded (None when absent)."""
        node = self.provenance().get("git_commit")
        return None if node.value is None else node.scalar()
