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
