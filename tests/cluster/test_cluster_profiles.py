"""Cluster profiles: the shipped ones load; every kind of bad field gives one error naming that field."""

from __future__ import annotations

import json

import pytest

from zeromismatch.launch.profiles import (
    ClusterProfile,
    list_profiles,
    load_profile,
    profile_from_dict,
    profiles_dir,
)


def _valid() -> dict:
    return json.loads((profiles_dir() / "local-cpu.json").read_text())


def test_shipped_profiles_load_and_describe_their_clusters():
    names = list_profiles()
    assert {"local-cpu", "h200-node"} <= set(names)
    for name in names:
        profile = load_profile(name)
        assert isinstance(profile, ClusterProfile) and profile.name == name

    local = load_profile("local-cpu")
    assert (local.partition, local.gpus_per_node, local.nodes, local.account) == ("debug", 0, 1, None)
    h200 = load_profile("h200-node")
    assert (h200.gpus_per_node, h200.gpu_type, h200.tasks_per_node, h200.exclusive) == (8, "H200", 1, True)
    # Site-specific names are placeholders, never literals baked into the repository.
    assert h200.placeholders() == {"partition": "ZM_SLURM_PARTITION", "account": "ZM_SLURM_ACCOUNT"}


def test_profiles_hold_no_site_paths():
    for path in profiles_dir().glob("*.json"):
        for value in json.loads(path.read_text()).values():
            texts = value if isinstance(value, list) else [value]
            for text in texts:
                assert not (isinstance(text, str) and text.startswith("/")), (path.name, text)


def test_to_dict_round_trips():
    profile = load_profile("h200-node")
    assert profile_from_dict(profile.to_dict()) == profile


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("nodes", 0, ValueError),
        ("nodes", True, TypeError),  # JSON true must not count as 1 node
        ("nodes", 1.5, TypeError),
        ("tasks_per_node", 0, ValueError),
        ("cpus_per_task", "4", TypeError),
        ("gpus_per_node", -1, ValueError),
        ("mem_gb", 0, ValueError),
        ("mem_gb", "lots", TypeError),
        ("timeout_min", 0, ValueError),
        ("exclusive", 1, TypeError),
        ("partition", "gpu h200", ValueError),
        ("partition", None, TypeError),
        ("account", 7, TypeError),
        ("account", "${lower case}", ValueError),
        ("gpu_type", "${ZM_GPU}", ValueError),  # only partition and account may be placeholders
        ("name", "Local CPU", ValueError),
        ("setup", "module load cuda", TypeError),
        ("setup", ["echo a\necho b"], TypeError),
        ("sbatch_extra", {"Bad Flag": "x"}, ValueError),
        ("sbatch_extra", {"constraint": 5}, TypeError),
        ("description", None, TypeError),
    ],
)
def test_bad_field_is_named(field, value, error):
    data = _valid()
    data[field] = value
    with pytest.raises(error, match=repr(field)):
        profile_from_dict(data, source="test")


def test_missing_and_unknown_fields_are_named():
    data = _valid()
    del data["partition"]
    with pytest.raises(ValueError, match="missing field 'partition'"):
        profile_from_dict(data)
    data = _valid()
    data["gpus"] = 8
    with pytest.raises(ValueError, match="unknown field 'gpus'"):
        profile_from_dict(data)
    with pytest.raises(TypeError, match="JSON object"):
        profile_from_dict(["not", "a", "mapping"])


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown cluster profile 'nope'.*known: .*local-cpu"):
        load_profile("nope", directory=profiles_dir())
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profile(tmp_path / "broken.json")
    data = _valid()
    (tmp_path / "renamed.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="field 'name' is 'local-cpu' but the file is 'renamed'"):
        load_profile(tmp_path / "renamed.json")


def test_profiles_directory_from_environment(tmp_path, monkeypatch):
    data = _valid() | {"name": "site-a", "partition": "a100"}
    (tmp_path / "site-a.json").write_text(json.dumps(data))
    monkeypatch.setenv("ZM_CLUSTER_PROFILES", str(tmp_path))
    assert list_profiles() == ["site-a"]
    assert load_profile("site-a").partition == "a100"


def test_placeholders_resolve_from_environment():
    data = _valid() | {"partition": "${ZM_T_PART:-gpu}", "account": "${ZM_T_ACCT}"}
    profile = profile_from_dict(data)
    resolved, unresolved = profile.resolved(environ={})
    assert (resolved.partition, resolved.account) == ("gpu", "${ZM_T_ACCT}")
    assert unresolved == {"account": "ZM_T_ACCT"}
    resolved, unresolved = profile.resolved(environ={"ZM_T_PART": "h200", "ZM_T_ACCT": "proj-1"})
    assert (resolved.partition, resolved.account, unresolved) == ("h200", "proj-1", {})
    with pytest.raises(ValueError, match="'account' came from"):
        profile.resolved(environ={"ZM_T_ACCT": "two words"})
