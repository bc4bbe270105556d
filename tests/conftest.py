"""Suite-wide settings: deterministic seeds, hypothesis profiles, GPU/vLLM/native-kernel skips."""

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


def pytest_collection_modifyitems(config, items):
    has_gpu = torch.cuda.is_available()
    has_vllm = importlib.util.find_spec("vllm") is not None
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    skip_vllm = pytest.mark.skip(reason="needs the vllm package (extra 'gpu'); it is not installed")
    native_reason = None
    if not os.environ.get("CI") and any("native" in item.keywords for item in items):
        from zeromismatch.kernels.native import unavailable_reason

        native_reason = unavailable_reason()  # CI installs a compiler (.ci/run): there they must run
    skip_native = pytest.mark.skip(reason=f"the aligned-native set cannot be built here: {native_reason}")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "vllm" in item.keywords and not has_vllm:
            item.add_marker(skip_vllm)
        if "native" in item.keywords and native_reason:
            item.add_marker(skip_native)


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield
