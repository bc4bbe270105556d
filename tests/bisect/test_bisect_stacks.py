"""The bisector on pairs whose two sides compute in different numerics: the fast FP8 rollout stack
(bf16 activations, FP8 weights, FP8 KV cache, bf16 head, stock kernels) against the fp32 aligned
trainer, and each of its paths alone; their repros fail; identical numerics find nothing."""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
import subprocess
import sys

import pytest
from bisect_helpers import SMALL

from zeromismatch.bisect import BisectConfig, format_text, run_bisect, write_repro
from zeromismatch.bisect.repro import command_line
from zeromismatch.cli import build_parser, main
from zeromismatch.commands.bisect import config_from_args
from zeromismatch.rl.stacks import get_stack

SMALL_ARGS = ["--num-seqs", "2", "--max-prompt-len", "9", "--max-response-len", "3"]
SHORT = {"float32": "fp32", "bfloat16": "bf16", None: None}


def stack_config(name: str, **overrides) -> BisectConfig:
    """The BisectConfig of stack ``name`` (learner on aligned kernels) at the SMALL workload."""
    stack = get_stack(name)
    fields = dict(
        rollout_kernels=stack.rollout_kernels or "aligned", trainer_kernels="aligned",
        dtype=SHORT[stack.dtype], quant=stack.quant, rollout_dtype=SHORT[stack.rollout_dtype],
        rollout_quant=stack.rollout_quant, kv_cache_dtype=stack.kv_cache_dtype,
        rollout_lm_head=stack.rollout_lm_head,
    )  # fmt: skip
    return BisectConfig("tiny-qwen3", **{**fields, **SMALL, **overrides})


@functools.cache
def fast_fp8():
    return run_bisect(stack_config("fast-fp8"))


@functools.cache
def bf16_aligned():
    return run_bisect(BisectConfig("tiny-qwen3", dtype="bf16", **SMALL))


def _repro(directory, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(directory / "repro.py"), *args], capture_output=True, text=True, timeout=300
    )


def test_fast_fp8_rollout_against_fp32_trainer_names_the_first_op_whose_values_differ():
    result = fast_fp8()
    cmp, first = result.comparison, result.first
    assert result.diverged and first is cmp.sites[0]  # bf16 vs fp32 from the very first op on
    # every call is matched although the sides take other entry points: quant_linear (engine) against
    # linear / row_parallel_linear, and the trainer's fused q/k/v and gate/up against one-by-one
    # projections; the engine's bf16 head, made outside the KernelSet, against the trainer's lm_head
    assert not cmp.trainer_only_sites and not cmp.engine_only_sites and cmp.unaligned_trainer_calls == 0
    assert all(s.rows_compared > 0 and s.rows_missing == 0 for s in cmp.sites)
    assert {s.engine_op for s in cmp.sites if s.op in ("linear", "row_parallel_linear")} == {"quant_linear"}
    split = {s.path.rsplit(".", 1)[-1] for s in cmp.sites if s.trainer_cols is not None}
    assert split == {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}
    head = next(s for s in cmp.sites if s.op == "lm_head")
    assert head.engine_outside == "activation-lm-head" and head.diverges
    # measured: the first layer's input norm, compared by value, its inputs already apart (the bf16
    # embedding table the engine looks up is not a kernel op)
    assert (first.op, first.layer, first.path) == ("rms_norm", 0, "model.layers.0.input_layernorm")
    assert first.compared == "values"
    assert first.engine_dtypes == ["bfloat16"] and first.trainer_dtypes == ["float32"]
    assert 0 < first.max_abs_diff < 1 and 0 < first.max_rel_diff < 0.1
    assert first.inputs_identical is False and 0 < first.input_max_abs_diff < first.max_abs_diff
    text = format_text(result)
    assert "rollout: kernels default, bfloat16, weights fp8, KV cache fp8_e4m3, lm_head activation" in text
    assert "trainer: kernels aligned, float32, weights none" in text
    assert "by value in float64 (rollout bfloat16 vs trainer float32" in text
    stats = result.logprob_stats
    assert not stats["identical"] and 0 < stats["diff_max"] < 1
    numerics = result.to_dict()["numerics"]
    assert numerics["rollout"]["kv_cache_dtype"] == "fp8_e4m3" and numerics["trainer"]["dtype"] == "float32"


def test_fast_fp8_repro_runs_both_numerics_and_fails(tmp_path):
    spec = write_repro(fast_fp8(), tmp_path / "repro")
    assert spec["numerics_differ"] and spec["minimize"]["reproduces"] and not spec["injected"]
    assert "different numerics" in (tmp_path / "repro" / "README.md").read_text()
    ran = _repro(tmp_path / "repro")
    out = ran.stdout
    assert ran.returncode == 1 and "FAIL" in out, out + ran.stderr
    assert "rollout [1, 128] bfloat16 vs trainer [1, 128] float32: DIFFERENT in value" in out
    assert "max abs diff" in out
    # the inputs differ in dtype: one kernel set on both sides does not make them agree
    assert _repro(tmp_path / "repro", "--kernels", "aligned").returncode == 1


def test_fused_projection_repro_compares_its_columns(tmp_path):
    """A divergence at a projection the trainer fused: the repro reruns the fused call whole and
    compares the projection's columns with the engine's quant_linear."""
    result = fast_fp8()
    site = next(s for s in result.comparison.sites if s.trainer_cols is not None)
    chosen = dataclasses.replace(result, comparison=dataclasses.replace(result.comparison, first=site))
    spec = write_repro(chosen, tmp_path / "repro")
    assert spec["op"] == {"rollout": "quant_linear", "trainer": "linear"}
    assert spec["cols"]["trainer"] == site.trainer_cols and spec["minimize"]["reproduces"]
    assert spec["args"]["rollout"]["qweight"]["kind"] == "quantized_weight"
    ran = _repro(tmp_path / "repro")
    assert ran.returncode == 1 and "compared on columns" in ran.stdout, ran.stdout + ran.stderr


def test_identical_numerics_on_both_sides_find_no_divergence(tmp_path):
    # the learner fake-quantizes its fp32 masters: its linear on them is the engine's quant_linear
    result = run_bisect(stack_config("aligned-fp8"))
    assert not result.diverged and result.logprob_stats["identical"]
    cmp = result.comparison
    assert not cmp.trainer_only_sites and not cmp.engine_only_sites
    assert {s.engine_op for s in cmp.sites if s.op == "linear"} == {"quant_linear"}
    # rollout fields that repeat the trainer's are the same pair
    spelled = run_bisect(stack_config("aligned-fp8", rollout_dtype="fp32", rollout_quant="fp8"))
    assert not spelled.diverged
    with pytest.raises(ValueError, match="no divergence to reproduce"):
        write_repro(result, tmp_path / "repro")


def test_a_bf16_head_alone_is_found_at_the_head(tmp_path):
    reference = bf16_aligned()
    assert not reference.diverged
    config = BisectConfig("tiny-qwen3", dtype="bf16", rollout_lm_head="activation", **SMALL)
    result = run_bisect(config, trainer=reference.trainer)
    first = result.first
    assert (first.op, first.layer, first.engine_outside) == ("lm_head", "head", "activation-lm-head")
    assert first.compared == "bits" and first.inputs_identical is True  # same hidden rows, same weight
    assert not any(s.diverges for s in result.comparison.sites[: result.comparison.sites.index(first)])
    spec = write_repro(result, tmp_path / "repro")
    assert spec["outside"] == {"rollout": "activation-lm-head", "trainer": None}
    ran = _repro(tmp_path / "repro")
    assert ran.returncode == 1 and "outside the KernelSet: activation-lm-head" in ran.stdout, ran.stdout
    # the fix: the kernel set's (fp32) head on the engine's own inputs gives the trainer's bits
    fixed = _repro(tmp_path / "repro", "--rollout-kernels", "aligned")
    assert fixed.returncode == 0 and "PASS: bitwise identical" in fixed.stdout, fixed.stdout + fixed.stderr


def test_an_fp8_kv_cache_alone_is_found_at_attention(tmp_path):
    reference = bf16_aligned()
    config = BisectConfig("tiny-qwen3", dtype="bf16", kv_cache_dtype="fp8_e4m3", **SMALL)
    result = run_bisect(config, trainer=reference.trainer)
    first = result.first
    assert (first.op, first.engine_op, first.layer) == ("attention", "paged_attention", 0)
    assert first.inputs_identical is True  # the queries; the cached K/V are what differ
    assert "fp8_e4m3 cache" in format_text(result)
    write_repro(result, tmp_path / "repro")
    ran = _repro(tmp_path / "repro")
    assert ran.returncode == 1 and "DIFFERENT bitwise" in ran.stdout, ran.stdout + ran.stderr


def test_cli_stack_fast_fp8_end_to_end(capsys, tmp_path):
    out_dir = tmp_path / "repro"
    argv = ["bisect", "--stack", "fast-fp8", "--model", "tiny-qwen3", "--json", "--out", str(out_dir)]
    rc = main([*argv, *SMALL_ARGS])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["diverged"]
    assert out["config"]["rollout_kernels"] == "default" and out["config"]["trainer_kernels"] == "aligned"
    assert out["numerics"]["rollout"] == {
        "kernels": "default", "dtype": "bfloat16", "quant": "fp8", "kv_cache_dtype": "fp8_e4m3",
        "lm_head": "activation",
    }  # fmt: skip
    first = out["first_divergence"]
    assert (first["op"], first["layer"], first["compared"]) == ("rms_norm", 0, "values")
    assert out["repro"]["dir"] == str(out_dir) and _repro(out_dir).returncode == 1
    # the recorded command spells the stack out and reruns the same bisection
    command = out["repro"]["bisect_command"]
    assert config_from_args(build_parser().parse_args(shlex.split(command)[1:])) == stack_config("fast-fp8")


def test_cli_identical_numerics_exit_zero_and_write_nothing(capsys, tmp_path):
    out_dir = tmp_path / "repro"
    argv = ["bisect", "--stack", "aligned-fp32", "--model", "tiny-qwen3", "--out", str(out_dir)]
    rc = main([*argv, *SMALL_ARGS])
    assert rc == 0 and "no divergence: nothing written" in capsys.readouterr().out
    assert not out_dir.exists() or not any(out_dir.iterdir())


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--rollout-kernels", "aligned", "--trainer-kernels", "aligned", "--kv-cache-dtype", "fp8_e4m3",
          "--dtype", "fp32"], "--kv-cache-dtype"),
        (["--stack", "fast-fp8", "--rollout-dtype", "fp32"], "--kv-cache-dtype"),
        (["--rollout-kernels", "default", "--trainer-kernels", "aligned", "--quant", "fp8", "--rollout-quant",
          "none"], "--quant"),
        (["--rollout-kernels", "default"], "--trainer-kernels"),
    ],
    ids=["fp8-kv-on-fp32", "stack-overridden-to-fp32", "trainer-only-format", "kernels-without-stack"],
)  # fmt: skip
def test_cli_bad_numerics_is_one_clear_error(capsys, monkeypatch, args, flag):
    import zeromismatch.bisect.report

    monkeypatch.setattr(zeromismatch.bisect.report, "run_bisect", lambda *a, **k: pytest.fail("bisected"))
    rc = main(["bisect", "--model", "tiny-qwen3", *args, *SMALL_ARGS])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"zm bisect: {flag}") and err.count("\n") == 1, err


def test_stack_kernels_are_defaults_a_kernel_flag_overrides():
    def parsed(*argv):
        return config_from_args(build_parser().parse_args(["bisect", "--model", "tiny-qwen3", *argv]))

    assert parsed("--stack", "fast-fp8") == BisectConfig(
        "tiny-qwen3", "default", "aligned", rollout_dtype="bf16", rollout_quant="fp8",
        kv_cache_dtype="fp8_e4m3", rollout_lm_head="activation",
    )  # fmt: skip
    assert parsed("--stack", "fast-fp8", "--rollout-kernels", "aligned").rollout_kernels == "aligned"
    assert parsed("--stack", "aligned-bf16").dtype == "bf16"
    # the old spelling, both kernel flags and no stack, keeps its defaults
    assert parsed("--rollout-kernels", "default", "--trainer-kernels", "aligned") == BisectConfig(
        "tiny-qwen3", "default", "aligned"
    )
    assert command_line(parsed("--stack", "fast-bf16")).count("--rollout-quant none") == 1


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(kv_cache_dtype="fp8_e4m3"), "kv_cache_dtype an FP8 KV cache needs a bfloat16 rollout"),
        (dict(rollout_dtype="fp16"), "rollout_dtype must be one of"),
        (dict(rollout_lm_head="bf16"), "rollout_lm_head must be one of"),
        (dict(quant="fp8", rollout_quant="nvfp4"), "quant a weight format on the learner"),
    ],
)
def test_bad_numerics_in_the_config_name_the_field(bad, message):
    with pytest.raises(ValueError, match=message):
        BisectConfig("tiny-qwen3", **bad).validate()
