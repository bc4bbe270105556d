"""zeromismatch.audit: published claims vs reproduced results.

- :mod:`.registry` loads and validates ``results/published/<experiment>.json`` (JSON Schema + checks);
- :mod:`.runs` reads reproduced run directories and benchmark files;
- :mod:`.verdicts` judges each claim from that data alone (five verdicts, see its docstring);
- :mod:`.integrity` checks that the run files are what their runs wrote (manifests, provenance,
  config hashes, recorded commits, committed data vs git HEAD);
- :mod:`.benchmarks`, :mod:`.learnability`, :mod:`.portability` render the report's measurement
  sections, reading their JSON files through :mod:`.inputs` (typed, one error naming file and key);
- :mod:`.report` builds the report's sections once as :mod:`.document` blocks, which render to
  REPORT.md and (:mod:`.html`) report.html; :mod:`.figures` draws the figures (all built in a
  staging directory, then moved over the old outputs).

Entry points: ``zm audit`` (table, ``--strict``) and ``python paper_figures/make_all.py``.
"""

from .registry import AuditInputError, Registry, default_results_root, load_registry
from .verdicts import VERDICTS, Verdict, evaluate_all, evaluate_claim, strict_regressions

__all__ = [
    "AuditInputError",
    "Registry",
    "VERDICTS",
    "Verdict",
    "build_all",
    "default_results_root",
    "evaluate_all",
    "evaluate_claim",
    "load_registry",
    "strict_regressions",
]


def build_all(results_root=None, *, quiet: bool = False):
    """See :func:`zeromismatch.audit.report.build_all` (imported lazily: it pulls in matplotlib)."""
    from .report import build_all as _build_all

    return _build_all(results_root, quiet=quiet)
