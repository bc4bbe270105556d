"""Every experiment folder: configs resolve, smoke scale runs end to end through the real
launcher, and the full-scale dry run writes real sbatch scripts and resolved configs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from experiment_helpers import EXPERIMENTS, ROOT, load

from zeromismatch.experiment.runner import run_experiment


def test_all_six_published_experiments_exist():
    assert EXPERIMENTS == [
        "deepseek_v4_flash_100steps", "nemotron_nvfp4_swebench", "osworld_step_time",
        "pipelinerl_v0_v1", "qwen3_30b_a3b_tools", "reinforce_zero_lag64",
    ]  # fmt: skip


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_configs_resolve_and_match_the_claims_registry(name):
    experiment = load(name)
    assert experiment.name == name
    arms = {arm.name for arm in experiment.arms_for("mini")}
    smoke = {arm.name for arm in experiment.arms_for("smoke")}
    assert smoke <= arms
    registry = json.loads((ROOT / "results" / "published" / f"{name}.json").read_text())
    claims = registry["claims"] if isinstance(registry, dict) else registry
    assert any(c["experiment"] == name for c in claims)


def _longest_model_turn(env: str, env_options: dict, n: int = 200) -> int:
    """Tokens in the longest model turn (closing marker or EOS included) of ``n`` demonstrations."""
    from zeromismatch.rl.rollout import demonstration_tokens

    options = {k: v for k, v in env_options.items() if k != "step_latency_s"}
    longest = 0
    for _, _, mask in demonstration_tokens(env, n, seed=0, env_options=options):
        run = 0
        for written_by_model in [*mask, False]:
            run = run + 1 if written_by_model else 0
            longest = max(longest, run)
    return longest


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_mini_arms_leave_room_for_a_correct_turn(name):
    """max_new_tokens below the longest correct action makes some tasks unsolvable (the rollout cuts the
    closing marker), which caps reward and pass@1 whatever RL does."""
    for arm in load(name).arms_for("mini"):
        needed = _longest_model_turn(arm.config.env, arm.config.env_options)
        assert arm.config.max_new_tokens >= needed, (arm.name, arm.config.max_new_tokens, needed)


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_smoke_scale_runs_every_arm(tmp_path, name):
    experiment = load(name)
    run_experiment(experiment, "smoke", out_root=tmp_path, quiet=True)
    for arm in experiment.arms_for("smoke"):
        run = tmp_path / name / "smoke" / arm.name
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == arm.config.steps
        assert (run / "provenance.json").exists()
    assert not list((tmp_path / name / "smoke").glob(".*partial"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_full_scale_dry_run_writes_sbatch(tmp_path, monkeypatch, name):
    import zeromismatch.experiment.runner as runner

    monkeypatch.setattr(runner, "default_out_root", lambda experiment, scale: tmp_path / "runs")
    out = run_experiment(load(name), "full", cluster="slurm", dry_run=True)
    folder = tmp_path / "runs" / "full" / name
    for arm in out:
        script = (folder / f"{name}.{arm}.sbatch").read_text()
        assert "#SBATCH" in script and "--gpus-per-node=8" in script
        resolved = json.loads((folder / f"{arm}.resolved.json").read_text())
        assert resolved["config"]["rollout_engine"].startswith("vllm")


def test_launcher_rejects_unknown_arm_with_one_clear_error():
    out = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "osworld_step_time" / "launch.py"), "--scale", "smoke",
         "--arms", "nope", "--out-root", "/nonexistent"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert "unknown arm(s) ['nope']" in out.stderr


def test_full_scale_dry_run_honours_out_root(tmp_path, monkeypatch):
    import zeromismatch.experiment.runner as runner

    monkeypatch.setattr(runner, "default_out_root", lambda experiment, scale: tmp_path / "root")
    experiment = load("reinforce_zero_lag64")
    run_experiment(experiment, "full", cluster="slurm", dry_run=True, out_root=tmp_path / "out")
    assert (tmp_path / "out" / "full" / "reinforce_zero_lag64" / "aligned.resolved.json").exists()
    assert not (tmp_path / "root").exists()


def test_full_scale_rejects_unknown_arm_and_non_slurm_cluster_before_writing(tmp_path):
    experiment = load("reinforce_zero_lag64")
    with pytest.raises(ValueError, match=r"unknown arm\(s\) \['nope'\]"):
        run_experiment(experiment, "full", ["nope"], cluster="slurm", dry_run=True, out_root=tmp_path)
    with pytest.raises(ValueError, match="--cluster slurm"):
        run_experiment(experiment, "full", cluster="local", dry_run=True, out_root=tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_full_scale_submission_is_refused_before_anything_is_written(tmp_path, name):
    # a real --scale full names every piece the full tier still lacks, in one line, and submits nothing
    argv = [sys.executable, str(ROOT / "experiments" / name / "launch.py"), "--scale", "full",
            "--cluster", "slurm", "--out-root", str(tmp_path / "out")]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"{name}: not submitting {name}/full: not built yet: ")
    assert "no GPU kernel set is built" in line
    assert not (tmp_path / "out").exists()


def test_full_scale_keeps_the_lag_of_non_headline_arms(tmp_path):
    experiment = load("reinforce_zero_lag64")
    run_experiment(experiment, "full", ["aligned_lag8", "aligned"], cluster="slurm", dry_run=True,
                   out_root=tmp_path)  # fmt: skip
    folder = tmp_path / "full" / "reinforce_zero_lag64"
    assert json.loads((folder / "aligned_lag8.resolved.json").read_text())["config"]["lag"] == 8
    assert json.loads((folder / "aligned.resolved.json").read_text())["config"]["lag"] == 64


def test_full_scale_config_carries_arm_choices_and_names_every_mini_only_setting():
    import dataclasses

    from zeromismatch.experiment.full import (
        ARM_CHOICE_FIELDS,
        GPU_KERNELS,
        PUBLISHED_FIELDS,
        full_scale_configs,
    )
    from zeromismatch.experiment.spec import FULL_SIZE_FIELDS, PUBLISHED_ENVS
    from zeromismatch.rl import RLConfig

    fields = {f.name for f in dataclasses.fields(RLConfig)}
    assert set(ARM_CHOICE_FIELDS) | set(PUBLISHED_FIELDS) <= fields
    for name in EXPERIMENTS:
        experiment = load(name)
        minis = {arm.name: arm.config for arm in experiment.arms_for("mini")}
        for arm, resolved in full_scale_configs(experiment).items():
            config, dropped = resolved["config"], resolved["not_carried_from_mini"]
            # every RLConfig field is either carried, set from the publication, or named as not carried
            assert fields == (set(config) & fields) | set(dropped), (name, arm)
            assert not set(config) & set(dropped)
            assert "max_new_tokens" in dropped and "env_options" in dropped and "sft_steps" in dropped
            full = experiment.full_for(arm)
            assert config["model"] == full.model and config["steps"] == full.updates
            # what the GPU tier needs, not the mini arm's CPU choices: the GPU counterpart of its kernel
            # set, bf16 unless the publication names a dtype, a named env, the sizes it must set
            assert config["kernels"] == GPU_KERNELS[minis[arm].kernels]
            assert config["kernels"] != "aligned" and config["dtype"] == (
                full.precision if full.precision in ("float32", "bfloat16") else "bfloat16"
            )
            assert config["checkpoint_every"] > 0  # a requeued job resumes instead of starting over
            assert config["env"] in PUBLISHED_ENVS and resolved["env_is"] == PUBLISHED_ENVS[config["env"]]
            assert set(resolved["sizes_not_stated"]) | (set(config) & set(FULL_SIZE_FIELDS)) == set(
                FULL_SIZE_FIELDS
            )


def test_full_scale_config_says_where_each_value_comes_from():
    """``source_of``: a reviewer must tell a published value from one we assumed or one the mini arm
    carries (found by review: fp32 dtypes and mini lags read as published)."""
    from zeromismatch.experiment.full import full_scale_configs
    from zeromismatch.experiment.spec import FULL_SIZE_FIELDS

    for name in EXPERIMENTS:
        for arm, resolved in full_scale_configs(load(name)).items():
            assert set(resolved["source_of"]) == set(resolved["config"]) | set(FULL_SIZE_FIELDS), (name, arm)
    deepseek = full_scale_configs(load("deepseek_v4_flash_100steps"))["aligned"]["source_of"]
    assert deepseek["model"] == "source S1" and deepseek["steps"] == "assumed"
    assert deepseek["quant"] == "assumed"
    assert deepseek["dtype"].startswith("assumed: bf16") and deepseek["algo"] == "mini arm"
    assert deepseek["kernels"] == "mini arm's 'aligned-native', as its GPU counterpart (GPU_KERNELS)"
    assert deepseek["lr"].startswith("not stated in S1")
    lag64 = full_scale_configs(load("reinforce_zero_lag64"))
    assert lag64["aligned"]["source_of"]["lag"] == "source S3"  # S3: lag 64 in agentic tool use
    assert lag64["aligned"]["config"]["lag"] == 64
    # S3 states no lag for its math-reasoning full run: the lag-2/8 arms keep the mini design's lags
    assert lag64["aligned_lag8"]["source_of"]["lag"] == "mini arm"
    assert lag64["aligned_lag8"]["config"]["lag"] == 8


def test_arms_of_another_published_run_resolve_to_that_run():
    # the lag-2/8 arms stand in for S3's math-reasoning runs, the lag-64 arms for the Qwen3-4B tool-use run
    # (every arm used to resolve to Qwen3-4B with Python tools)
    from zeromismatch.experiment.full import full_scale_configs

    experiment = load("reinforce_zero_lag64")
    resolved = full_scale_configs(experiment)
    tools, math = resolved["fast"], resolved["fast_lag8"]
    assert tools["config"]["model"] == "Qwen/Qwen3-4B" and tools["source_of"]["model"] == "source S3"
    assert tools["config"]["steps"] == 5000 and tools["config"]["context_tokens"] == 16384
    assert math["config"]["model"] != "Qwen/Qwen3-4B" and math["source_of"]["model"] == "assumed"
    assert math["config"]["steps"] == 20000 and math["source_of"]["steps"] == "source S3"
    assert "math" in math["config"]["env"] and math["published"]["model"] == math["config"]["model"]


def test_a_full_job_on_a_node_without_the_full_tier_fails_naming_each_missing_piece(tmp_path):
    # what a hand-submitted job (or a resubmitted dry-run script) does here: it fails, and writes nothing
    from zeromismatch.experiment.full import full_scale_configs, run_full_arm

    resolved = full_scale_configs(load("reinforce_zero_lag64"))["aligned"]
    with pytest.raises(RuntimeError, match="reinforce_zero_lag64/full/aligned cannot run here: ") as err:
        run_full_arm("reinforce_zero_lag64", resolved, str(tmp_path / "aligned"))
    assert "kernels='aligned-triton': no GPU kernel set is built" in str(err.value)
    assert "env='python-tools' (agentic tool use with Python tools, 16K context (S3)): not built" in str(
        err.value
    )
    assert "sizes the source does not state: lr, group_size, prompts_per_step, max_new_tokens" in str(
        err.value
    )
    if not torch.cuda.is_available():
        assert "no CUDA GPU on this node" in str(err.value)
    assert not list(tmp_path.iterdir())


def test_launcher_rejects_out_root_that_is_a_file(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("hi")
    out = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "osworld_step_time" / "launch.py"), "--scale", "smoke",
         "--out-root", str(afile)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert "not a directory" in out.stderr and "Traceback" not in out.stderr


def test_a_seeded_arm_runs_once_per_seed_under_its_name():
    from zeromismatch.experiment import Arm
    from zeromismatch.rl import RLConfig

    runs = Arm("fast", RLConfig(seed=7), seeds=(0, 2)).runs()
    assert [(name, config.seed) for name, config in runs] == [("fast/seed0", 0), ("fast/seed2", 2)]
    assert [(name, config.seed) for name, config in Arm("plain", RLConfig(seed=7)).runs()] == [("plain", 7)]
    with pytest.raises(ValueError, match="seeds repeat"):
        Arm("fast", RLConfig(), seeds=(1, 1)).runs()
