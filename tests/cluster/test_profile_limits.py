"""Numbers Python's json accepts but Slurm cannot use (Infinity, NaN) are one clear error, in a profile
file and in a per-job override, before any script is written."""

from __future__ import annotations

import json
import math

import pytest

from zeromismatch.launch.profiles import load_profile, profile_from_dict, profiles_dir
from zeromismatch.launch.submit import resolve_job


def _valid() -> dict:
    return json.loads((profiles_dir() / "local-cpu.json").read_text())


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_profile_mem_gb_must_be_finite(value):
    data = _valid()
    data["mem_gb"] = value
    with pytest.raises(ValueError, match="'mem_gb' must be > 0 and finite"):
        profile_from_dict(data, source="test")


def test_profile_file_with_infinity_is_rejected_on_load(tmp_path):
    data = _valid()
    data["mem_gb"], data["name"] = math.inf, "inf-mem"
    path = tmp_path / "inf-mem.json"
    path.write_text(json.dumps(data))  # json writes the non-standard token Infinity
    assert "Infinity" in path.read_text()
    with pytest.raises(ValueError, match="mem_gb"):
        load_profile(str(path))


@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0])
def test_resolve_job_mem_gb_override_must_be_finite(value):
    with pytest.raises(ValueError, match="mem_gb must be a number > 0 and finite"):
        resolve_job(load_profile("local-cpu"), mem_gb=value)
    assert resolve_job(load_profile("local-cpu"), mem_gb=2.5)["mem_gb"] == 2.5
