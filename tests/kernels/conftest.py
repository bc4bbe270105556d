"""Fixtures shared by the kernel tests: both kernel sets."""

from __future__ import annotations

import pytest

from zeromismatch.kernels import get_kernels


@pytest.fixture(scope="session")
def aligned():
    return get_kernels("aligned")


@pytest.fixture(scope="session")
def default():
    return get_kernels("default")


@pytest.fixture(scope="module")
def monkeypatch_fallback():
    """Force aligned GEMMs onto the MKL fallback (as on a torch build without oneDNN)."""
    from zeromismatch.kernels.aligned import gemm

    saved = gemm._ONEDNN
    gemm._ONEDNN = False
    yield
    gemm._ONEDNN = saved
