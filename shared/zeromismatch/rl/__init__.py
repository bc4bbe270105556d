"""RL loops on the aligned stack: sync, async with policy lag k <= 64, in-process or on Ray.

``train(RLConfig(...), out_dir)`` runs one; ``zm train`` is the command line.
"""

from .config import ALGOS, RLConfig
from .loop import Run, train

__all__ = ["ALGOS", "RLConfig", "Run", "train"]
