"""The launcher's cluster options: where submitit writes, which profile it uses, how FullScale.precision
is resolved, and what a full-scale dry run says about placeholders. Nothing is trained or submitted:
``submit`` is replaced by a recorder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from experiment_helpers import EXPERIMENTS, load

import zeromismatch.launch  # noqa: F401  (loads the submodule the runner imports submit from)
from zeromismatch.experiment import full, runner
from zeromismatch.rl.stacks import DTYPES, QUANTS


@pytest.fixture
def recorded_submits(monkeypatch):
    """Replace launch.submit.submit (the package attribute of that name is the function, so patch the
    module in sys.modules) with a recorder whose jobs return an empty summary."""
    calls = []

    class FakeJob:
        def result(self):
            return {}

    def fake_submit(fn, *args, **kwargs):
        calls.append(kwargs)
        return FakeJob()

    monkeypatch.setattr(sys.modules["zeromismatch.launch.submit"], "submit", fake_submit)
    return calls


@pytest.mark.parametrize("cluster", ["local", "debug", "slurm"])
def test_submitit_files_go_under_the_out_root_in_a_hidden_dir(tmp_path, recorded_submits, cluster):
    experiment = load("reinforce_zero_lag64")
    out_root = tmp_path / "out"
    runner.run_experiment(experiment, "smoke", ["aligned"], cluster=cluster, out_root=out_root, force=True)
    (call,) = recorded_submits
    assert Path(call["folder"]) == out_root / ".submitit" / experiment.name
    assert call["cluster"] == cluster and call["profile"] == "local-cpu"


def test_profile_option_reaches_submit(tmp_path, recorded_submits):
    experiment = load("reinforce_zero_lag64")
    runner.run_experiment(
        experiment, "smoke", ["aligned"], cluster="slurm", out_root=tmp_path, force=True, profile="h200-node"
    )
    assert recorded_submits[0]["profile"] == "h200-node"


def test_launcher_profile_option_is_validated_with_one_clear_error(tmp_path, recorded_submits, capsys):
    experiment = load("reinforce_zero_lag64")
    argv = ["--scale", "smoke", "--cluster", "slurm", "--profile", "nope", "--out-root", str(tmp_path)]
    assert runner.launch_main(experiment, argv) == 2
    err = capsys.readouterr().err
    assert "unknown --profile 'nope'" in err and "local-cpu" in err and "h200-node" in err
    assert recorded_submits == [] and not (tmp_path / experiment.name).exists()
    argv = ["--scale", "smoke", "--cluster", "slurm", "--profile", "h200-node", "--out-root", str(tmp_path)]
    assert runner.launch_main(experiment, [*argv, "--arms", "aligned", "--force", "--quiet"]) == 0
    assert recorded_submits[0]["profile"] == "h200-node"


def test_hidden_dirs_are_not_read_by_the_audit(tmp_path):
    # a guard for the choice of a dot-directory: the audit lists directories through _subdirs
    from zeromismatch.audit.runs import _subdirs

    (tmp_path / "aligned").mkdir()
    (tmp_path / ".submitit").mkdir()
    assert [p.name for p in _subdirs(tmp_path)] == ["aligned"]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_full_configs_have_a_valid_dtype_and_quant(name):
    for arm, resolved in full.full_scale_configs(load(name)).items():
        config = resolved["config"]
        assert config["dtype"] in DTYPES, (name, arm, config["dtype"])
        assert config["quant"] in QUANTS, (name, arm, config["quant"])


def test_full_precision_is_a_quant_for_weight_formats_and_a_dtype_otherwise():
    import dataclasses

    def engine_formats(configs):
        return {r["config"]["rollout_quant"] or r["config"]["quant"] for r in configs.values()}

    nemotron = full.full_scale_configs(load("nemotron_nvfp4_swebench"))
    assert engine_formats(nemotron) == {"nvfp4"}
    # a fast arm keeps its learner on fp32 masters: the published format lands on its engine only
    assert nemotron["fast"]["config"]["quant"] == "none" and nemotron["aligned"]["config"]["quant"] == "nvfp4"
    deepseek = full.full_scale_configs(load("deepseek_v4_flash_100steps"))
    assert engine_formats(deepseek) == {"fp8-block"}
    experiment = load("reinforce_zero_lag64")
    bf16 = dataclasses.replace(
        experiment, full=dataclasses.replace(experiment.full, precision="bfloat16"), full_by_arm={}
    )
    assert {r["config"]["dtype"] for r in full.full_scale_configs(bf16).values()} == {"bfloat16"}
    bad = dataclasses.replace(experiment, full=dataclasses.replace(experiment.full, precision="int3"))
    with pytest.raises(ValueError, match="reinforce_zero_lag64: FullScale.precision 'int3'"):
        full.full_scale_configs(bad)


def test_full_dry_run_names_the_variables_its_placeholders_need(tmp_path, monkeypatch, capsys):
    for var in ("ZM_SLURM_PARTITION", "ZM_SLURM_ACCOUNT"):
        monkeypatch.delenv(var, raising=False)
    experiment = load("reinforce_zero_lag64")
    runner.run_experiment(experiment, "full", ["aligned"], cluster="slurm", dry_run=True, out_root=tmp_path)
    err = capsys.readouterr().err
    assert "ZM_SLURM_PARTITION" in err and "ZM_SLURM_ACCOUNT" in err
    monkeypatch.setenv("ZM_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("ZM_SLURM_ACCOUNT", "proj")
    runner.run_experiment(experiment, "full", ["aligned"], cluster="slurm", dry_run=True, out_root=tmp_path)
    assert "placeholder" not in capsys.readouterr().err


def test_an_arm_another_launcher_is_running_is_skipped_and_left_alone(tmp_path, capsys, monkeypatch):
    """Two launchers sharing an out root: the second skips the arm the first holds (and leaves its
    ``.partial`` alone) and runs the rest."""
    import zeromismatch.rl
    from zeromismatch.io import directory_lock

    trained = []

    def fake_train(config, out, resume=False, quiet=True):
        out.mkdir(parents=True)
        (out / "summary.json").write_text("{}")
        trained.append(out.name)
        return {}

    monkeypatch.setattr(zeromismatch.rl, "train", fake_train)
    experiment = load("reinforce_zero_lag64")
    scale_dir = tmp_path / experiment.name / "smoke"
    partial = scale_dir / ".aligned_lag0.partial"
    partial.mkdir(parents=True)
    (partial / "metrics.jsonl").write_text("{}\n")
    with directory_lock(scale_dir, "run of arm aligned_lag0", name=".aligned_lag0.lock"):
        runner.run_experiment(experiment, "smoke", ["aligned_lag0", "default"], out_root=tmp_path)
    out = capsys.readouterr().out
    assert f"{experiment.name}/smoke/aligned_lag0: being run by another process, skipped" in out
    assert trained == [".default.partial"] and (partial / "metrics.jsonl").exists()
