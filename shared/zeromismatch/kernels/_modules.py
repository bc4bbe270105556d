"""Build a KernelSet class whose ops are the same-named functions of some modules.

Each kernel set keeps one op family per file (gemm/dense, attention, moe, ssm); this
turns those files into the class the registry hands out, so no set repeats the
KernelSet signature list by hand. An op missing from every module is a TypeError at
import, naming the op — a set cannot silently fall back to another set's kernel.
"""

from __future__ import annotations

from types import ModuleType

from .base import KernelSet


def kernel_set_from_modules(
    class_name: str, set_name: str, modules: list[ModuleType], doc: str, promises_invariance: bool = False
):
    namespace: dict[str, object] = {
        "name": set_name,
        "__doc__": doc,
        "__module__": modules[0].__package__,
        "promises_invariance": promises_invariance,
    }
    for op in sorted(KernelSet.__abstractmethods__):
        owner = next((m for m in modules if callable(getattr(m, op, None))), None)
        if owner is None:
            where = ", ".join(m.__name__ for m in modules)
            raise TypeError(f"kernel set {set_name!r}: no module of [{where}] defines op {op!r}")
        namespace[op] = staticmethod(getattr(owner, op))
    return type(class_name, (KernelSet,), namespace)
