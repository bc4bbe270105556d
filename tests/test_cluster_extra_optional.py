"""Without the ``cluster`` extra (ray, submitit) its tests skip with a reason; under CI they still run.

Runs a few of those tests in a child pytest with both packages hidden (a ``None`` in ``sys.modules``
makes their import fail as if they were not installed; nothing is uninstalled), once without and
once with ``CI`` set. The marker is ``@pytest.mark.cluster`` (tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NEEDS_RAY = "tests/rl/test_rl_ray_guards.py::test_ray_run_needs_two_cpus"
NEEDS_SUBMITIT = "tests/cluster/test_cluster_submit.py::test_dry_run_for_local_cluster_writes_config_only"
NEEDS_NEITHER = "tests/cluster/test_cluster_submit.py::test_non_callable_is_rejected"

HIDE = """import sys

for name in ("ray", "submitit"):
    sys.modules[name] = None  # import fails as it does without the extra
"""


def _pytest_without_the_extra(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess:
    (tmp_path / "hide_cluster_extra.py").write_text(HIDE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(PYTHONPATH=str(tmp_path), OMP_NUM_THREADS="1", **({"CI": "1"} if ci else {}))
    args = [sys.executable, "-m", "pytest", "-p", "hide_cluster_extra", "-p", "no:cacheprovider", "-q", "-rs"]
    return subprocess.run(
        [*args, NEEDS_RAY, NEEDS_SUBMITIT, NEEDS_NEITHER],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


@pytest.mark.slow
def test_cluster_tests_skip_with_a_reason_without_the_extra(tmp_path):
    result = _pytest_without_the_extra(tmp_path, ci=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 2 skipped" in result.stdout, result.stdout
    for package in ("ray", "submitit"):
        assert f"needs {package} (extra 'cluster'" in result.stdout, result.stdout


@pytest.mark.slow
def test_cluster_tests_still_run_under_ci(tmp_path):
    result = _pytest_without_the_extra(tmp_path, ci=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 failed, 1 passed" in result.stdout, result.stdout
    assert "ModuleNotFoundError" in result.stdout
