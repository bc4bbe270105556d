"""Named numeric stacks (rl/stacks.py): every aligned stack is exactly zero, its fast inverse is not.

The parity chain for formats: for every preset, each ``aligned-<fmt>`` stack gives diff max / mean / std
and k3 exactly 0 in ``zm parity``'s randomized workload (staggered arrivals, chunked prefill, prefix
cache) and at every step of a 20-step ``zm train`` (the learner fake-quantizing fp32 master weights,
the engine re-quantizing them at every weight update); each has an inverse -- the matching ``fast``
stack, the same format taken the fast way -- whose diff is nonzero, so the zeros cannot be vacuous.
"""

from __future__ import annotations

import json

import pytest
from rl_helpers import read_metrics, tiny_config

from zeromismatch.cli import main
from zeromismatch.models import TINY_PRESETS
from zeromismatch.parity import run_parity
from zeromismatch.rl import RLConfig, train
from zeromismatch.rl.stacks import STACKS, get_stack, inverse_of, stack_fields

ALIGNED = sorted(name for name, s in STACKS.items() if s.aligned)
ZEROS = ("diff_max", "diff_mean", "diff_std", "k3_kl")


def _parity(preset: str, stack: str, **kwargs) -> dict:
    fields = stack_fields(stack)
    return run_parity(preset, seed=1, num_prompts=4, max_tokens=5, top_p=0.9, **fields, **kwargs)


def test_every_stack_documents_what_it_stands_for():
    for stack in STACKS.values():
        assert stack.stands_for and stack.not_modelled
        RLConfig(**stack.fields())  # every stack is a valid configuration
    assert {inverse_of(name) for name in ALIGNED} <= set(STACKS)
    with pytest.raises(ValueError, match="unknown stack"):
        get_stack("fast-int4")


@pytest.mark.slow
@pytest.mark.parametrize("preset", TINY_PRESETS)
@pytest.mark.parametrize("stack", ALIGNED)
def test_aligned_stack_is_exactly_zero_and_its_fast_inverse_is_not(preset, stack):
    result = _parity(preset, stack)
    assert result["identical"] and result["tokens"] > 0 and result["informative_tokens"] > 0
    assert [result[key] for key in ZEROS] == [0.0] * 4, result
    inverse = _parity(preset, inverse_of(stack))
    assert not inverse["identical"]
    assert inverse["diff_max"] > 0 or inverse["nonfinite_tokens"] > 0


def _stack_run(tmp_path, preset: str, stack: str, steps: int, **overrides):
    config = tiny_config(
        model=preset, steps=steps, eval_size=2, eval_samples=0, **stack_fields(stack), **overrides
    )
    out = tmp_path / f"{preset}-{stack}"
    return train(config, out, quiet=True), read_metrics(out)


@pytest.mark.slow
@pytest.mark.parametrize("preset", TINY_PRESETS)
@pytest.mark.parametrize("stack", ["aligned-bf16", "aligned-fp8", "aligned-fp8-block", "aligned-nvfp4"])
def test_aligned_format_trains_twenty_steps_at_exact_zero(tmp_path, preset, stack):
    summary, records = _stack_run(tmp_path, preset, stack, steps=20)
    assert len(records) == 20
    for record in records:
        assert [record[key] for key in ZEROS] == [0.0] * 4, record["step"]
    assert summary["steps_with_zero_mismatch"] == 20
    assert summary["k3_kl_first_step"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["fast-bf16", "fast-fp8", "fast-nvfp4"])
def test_fast_stack_trains_with_a_nonzero_mismatch_it_records_from_step_zero(tmp_path, stack):
    summary, records = _stack_run(tmp_path, "tiny-qwen3", stack, steps=3)
    assert records[0]["k3_kl"] > 0 and records[0]["diff_max"] > 0
    assert summary["k3_kl_first_step"] == records[0]["k3_kl"]
    provenance = json.loads((tmp_path / f"tiny-qwen3-{stack}" / "provenance.json").read_text())
    rollout = provenance["sides"]["rollout"]
    assert (
        rollout["dtype"] == "bfloat16"
        and rollout["kernels"] == "default"
        and not provenance["sides"]["aligned"]
    )


@pytest.mark.slow
def test_resume_with_a_quantized_rollout_is_bitwise(tmp_path):
    config = tiny_config(steps=4, checkpoint_every=2, eval_size=2, eval_samples=0, **stack_fields("fast-fp8"))
    whole = train(config, tmp_path / "whole", quiet=True)
    train(config.replace(steps=2), tmp_path / "part", quiet=True)
    # the interrupted run continues with the full config from its step-2 checkpoint
    (tmp_path / "part" / "config.json").write_text(json.dumps(config.to_dict()))
    resumed = train(config, tmp_path / "part", resume=True, quiet=True)
    assert resumed["weights_sha256"] == whole["weights_sha256"]
    assert read_metrics(tmp_path / "part") == read_metrics(tmp_path / "whole")


@pytest.mark.slow
def test_parity_on_a_checkpoint_measures_the_trained_weights(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config(steps=1, sft_steps=3, checkpoint_every=1, eval_size=2, eval_samples=0), run, quiet=True)
    assert (run / "checkpoints" / "step_000000").is_dir()  # the warm start, before any RL update
    base = ["parity", "--checkpoint", str(run), "--num-prompts", "3", "--max-tokens", "4", "--json"]
    assert main([*base, "--stack", "aligned-fp8"]) == 0
    aligned = json.loads(capsys.readouterr().out)
    assert [aligned[key] for key in ZEROS] == [0.0] * 4 and aligned["weights_sha256"]
    assert main([*base, "--stack", "fast-fp8"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert fast["k3_kl"] > 0 and fast["model"] == "tiny-qwen3"
    assert main([*base, "--model", "tiny-deepseek-v3"]) == 2
    assert "holds a tiny-qwen3 policy" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--quant", "fp8", "--rollout-quant", "none"], "--quant: a weight format on the learner"),
        (["--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype: an FP8 KV cache needs a bfloat16 rollout"),
        (["--stack", "fast-fp8", "--rollout-dtype", "fp32"], "--kv-cache-dtype"),
    ],
)
def test_bad_numerics_are_one_clear_error_before_anything_is_written(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    for command in (["train", "--out", str(out), "--steps", "1"], ["parity", "--model", "tiny-qwen3"]):
        assert main([*command, *flags]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_an_unknown_format_is_refused_by_the_flag_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--out", "x", "--rollout-quant", "int3"])
    assert exit_info.value.code == 2 and "--rollout-quant" in capsys.readouterr().err


def test_nvfp4_on_shapes_it_cannot_block_fails_before_the_run_writes(tmp_path):
    # a hidden size that is no multiple of NVFP4's 16-element block
    config = tiny_config(model_overrides={"hidden_size": 40, "head_dim": 20}, **stack_fields("fast-nvfp4"))
    with pytest.raises(ValueError, match="nvfp4"):
        train(config, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "config.json").exists()


def test_a_config_written_before_the_head_field_was_renamed_still_loads():
    data = RLConfig().to_dict()
    data["lm_head_precision"] = data.pop("rollout_lm_head")
    assert RLConfig.from_dict(data) == RLConfig()
