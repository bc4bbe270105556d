"""The ``bisect_command`` a repro records reruns the same bisection, and ``zm bisect --seed`` is bounded."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from zeromismatch.bisect import repro
from zeromismatch.bisect.driver import BisectConfig
from zeromismatch.cli import build_parser, main
from zeromismatch.commands.bisect import config_from_args

EVERY_FIELD_CHANGED = BisectConfig(
    model="tiny-qwen3", rollout_kernels="default", trainer_kernels="default", seed=7, num_seqs=2,
    max_prompt_len=24, max_response_len=3, dtype="bf16", quant="fp8", rollout_dtype="bf16",
    rollout_quant="fp8", kv_cache_dtype="fp8_e4m3", rollout_lm_head="activation", temperature=0.7, top_k=5,
    top_p=0.9, logprobs_mode="raw", prefill_chunk=8, max_num_seqs=3, max_num_batched_tokens=32, block_size=8,
    perturb="rms_norm@0",
)  # fmt: skip


def _parsed_back(command: str) -> BisectConfig:
    """The config ``zm bisect`` builds from ``command`` (its own argument conversion)."""
    argv = shlex.split(command)
    assert argv[:2] == ["zm", "bisect"]
    return config_from_args(build_parser().parse_args(argv[1:]))


@pytest.mark.parametrize(
    "config",
    [EVERY_FIELD_CHANGED, BisectConfig(model="tiny-qwen3"), BisectConfig(model="tiny-qwen3", top_p=0.95)],
    ids=["every-field", "defaults", "one-field"],
)
def test_recorded_command_parses_back_to_the_same_config(config):
    assert dataclasses.fields(BisectConfig)[-1].name == "perturb"  # the fixture changes every field
    assert all(
        getattr(EVERY_FIELD_CHANGED, f.name) != f.default
        for f in dataclasses.fields(BisectConfig) if f.default is not dataclasses.MISSING
    )  # fmt: skip
    assert _parsed_back(repro.command_line(config)) == config
    assert repro.unexpressible_settings(config) == []


def test_unchunked_prefill_is_spelled_none_and_parses_back():
    config = BisectConfig(model="tiny-qwen3", prefill_chunk=None, top_k=3)
    assert "--prefill-chunk none" in repro.command_line(config)
    assert repro.unexpressible_settings(config) == []
    assert _parsed_back(repro.command_line(config)) == config


def test_a_setting_without_a_flag_is_named_not_dropped_silently():
    config = BisectConfig(model="tiny-qwen3", top_k=3, max_num_seqs=None)  # no flag spells this None
    assert repro.unexpressible_settings(config) == ["max_num_seqs=None"]
    assert _parsed_back(repro.command_line(config)) == dataclasses.replace(config, max_num_seqs=4)


@pytest.mark.parametrize("bad", ["0", "-2", "four"])
def test_bad_prefill_chunk_is_one_clear_error(bad, capsys):
    argv = ["bisect", "--model", "tiny-qwen3", "--rollout-kernels", "aligned", "--trainer-kernels", "aligned",
            "--prefill-chunk", bad]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and "--prefill-chunk" in capsys.readouterr().err


@pytest.mark.parametrize("seed", [-1, 2**63, 2**64])
def test_bisect_seed_out_of_range_is_one_clear_error(seed, capsys, tmp_path):
    argv = ["bisect", "--model", "tiny-qwen3", "--rollout-kernels", "aligned", "--trainer-kernels", "aligned",
            "--seed", str(seed), "--out", str(tmp_path / "repro")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("zm bisect: --seed") and err.count("\n") == 1
    assert not (tmp_path / "repro").exists()
