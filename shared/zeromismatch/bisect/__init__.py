"""First diverging operator between the rollout engine and the trainer, and its minimal repro.

``run_bisect(BisectConfig(model, rollout_kernels, trainer_kernels, ...))`` runs the same
teacher-forced tokens through the real engine (kernel set A, the rollout's dtype, weight format,
KV cache and head) and the trainer's recompute (kernel set B, the learner's dtype and format)
with every kernel call recorded (``recorder.RecordingKernels``), matches the calls by site and
token (``compare``), and reports the first op in the trainer's execution order whose output
differs -- bitwise, or by value where the two sides' dtypes differ (``report``).
``write_repro`` saves that op's two calls as a standalone script (``repro``). The CLI is
``zm bisect``; the procedure around it is ``docs/skills/align-new-model/SKILL.md``.
"""

from .compare import Comparison, SiteDiff, compare_records
from .driver import BisectConfig, SideRun, run_sides
from .recorder import KERNEL_OPS, CallRecord, Perturbation, RecordingKernels
from .report import BisectResult, format_text, run_bisect
from .repro import write_repro

__all__ = [
    "KERNEL_OPS",
    "BisectConfig",
    "BisectResult",
    "CallRecord",
    "Comparison",
    "Perturbation",
    "RecordingKernels",
    "SideRun",
    "SiteDiff",
    "compare_records",
    "format_text",
    "run_bisect",
    "run_sides",
    "write_repro",
]
