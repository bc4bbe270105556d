"""zeromismatch.envs: verifiable-reward environments and the tokenizer they share.

``make_env(name, **options)`` builds one of: arithmetic (reasoning, pass@1), tools (multi-turn
calculator), code_repair (unit-test reward), desktop (multi-step screens with step latency).
"""

from __future__ import annotations

from zeromismatch.envs.arithmetic import ArithmeticEnv
from zeromismatch.envs.base import SPLITS, Demonstration, Env, StepResult, Task
from zeromismatch.envs.code_repair import CodeRepairEnv
from zeromismatch.envs.desktop import DesktopEnv
from zeromismatch.envs.safe_eval import UnsafeExpressionError, safe_eval
from zeromismatch.envs.tokenizer import CharTokenizer, default_tokenizer
from zeromismatch.envs.tools import ToolsEnv

ENVS: dict[str, type[Env]] = {
    "arithmetic": ArithmeticEnv,
    "tools": ToolsEnv,
    "code_repair": CodeRepairEnv,
    "desktop": DesktopEnv,
}


def make_env(name: str, **options) -> Env:
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}; choose one of {sorted(ENVS)}")
    return ENVS[name](**options)


__all__ = [
    "ENVS",
    "SPLITS",
    "ArithmeticEnv",
    "CharTokenizer",
    "CodeRepairEnv",
    "Demonstration",
    "DesktopEnv",
    "Env",
    "StepResult",
    "Task",
    "ToolsEnv",
    "UnsafeExpressionError",
    "default_tokenizer",
    "make_env",
    "safe_eval",
]
