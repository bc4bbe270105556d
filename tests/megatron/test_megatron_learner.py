"""The Megatron learner backend: ``RLConfig.trainer``, ``build_policy`` / ``Learner`` on the Megatron
model, the ``zm train`` / ``zm parity`` flags, and their bad inputs (one line, exit 2)."""

from __future__ import annotations

import copy

import pytest
import torch

from zeromismatch.cli import main
from zeromismatch.integrations.megatron.model import MegatronCausalLM
from zeromismatch.models import CausalLM
from zeromismatch.rl import RLConfig
from zeromismatch.rl.learner import Learner, build_policy, weights_hash

pytestmark = pytest.mark.megatron

TINY = dict(env="arithmetic", steps=1, prompts_per_step=2, group_size=2, max_new_tokens=4, eval_size=2,
            eval_samples=1, micro_batch_size=4)  # fmt: skip


def test_trainer_field_defaults_and_round_trips():
    assert RLConfig().trainer == "zeromismatch"
    config = RLConfig(trainer="megatron", **TINY)
    assert RLConfig.from_dict(config.to_dict()) == config
    old = {k: v for k, v in RLConfig(**TINY).to_dict().items() if k != "trainer"}  # a config.json from before
    assert RLConfig.from_dict(old).trainer == "zeromismatch"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(trainer="deepspeed"), r"^RLConfig.trainer: must be one of \('zeromismatch', 'megatron'\)"),
        (dict(trainer="megatron", model="tiny-nemotron-h", model_overrides={"mlp_bias": True}),
         r"^RLConfig.model: no Megatron spec for a nemotron_h model with mlp_bias"),
    ],
)  # fmt: skip
def test_what_the_megatron_learner_cannot_run_is_one_clear_error(changes, message):
    with pytest.raises(ValueError, match=message):
        RLConfig(**{**TINY, **changes})


def test_build_policy_gives_the_learner_a_megatron_model_with_the_projects_weights():
    config = RLConfig(trainer="megatron", **TINY)
    learner, rollout = build_policy(config, "learner"), build_policy(config, "rollout")
    assert isinstance(learner, MegatronCausalLM) and isinstance(rollout, CausalLM)
    assert weights_hash(learner) == weights_hash(rollout) == weights_hash(build_policy(config.replace(
        trainer="zeromismatch"), "learner"))  # fmt: skip
    twin = copy.deepcopy(learner)  # the learner's shadow model
    assert isinstance(twin, MegatronCausalLM) and weights_hash(twin) == weights_hash(learner)
    assert all(a is not b for a, b in zip(twin.parameters(), learner.parameters()))


def test_learner_optimizer_steps_the_megatron_parameters():
    learner = Learner(RLConfig(trainer="megatron", **TINY))
    params = [p for group in learner.optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in params] == [id(p) for p in learner.model.gpt.parameters()]
    before = weights_hash(learner.model)
    data = [([1, 5, 9], [4, 2, 3], [True, True, True])]
    loss = learner.sft_step(data, lr=1e-2)
    assert loss > 0 and weights_hash(learner.model) != before
    assert all(torch.isfinite(p).all() for p in learner.model.parameters())


def test_zm_train_trainer_megatron_runs(tmp_path, capsys):
    assert main(["train", "--trainer", "megatron", "--steps", "2", "--prompts-per-step", "2", "--group-size",
                 "2", "--max-new-tokens", "3", "--eval-size", "2", "--eval-samples", "0",
                 "--quiet", "--out", str(tmp_path / "run")]) == 0  # fmt: skip
    import json

    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["trainer"] == "megatron"
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["k3_kl"] for r in records] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["parity", "--trainer", "megatron", "--model", "tiny-nemotron-h", "--trainer-tp", "4"],
         "zm parity: --trainer-tp 4 must divide the model's num_key_value_heads=2"),
        (["parity", "--trainer", "megatron", "--model", "tiny-qwen3", "--trainer-tp", "4"],
         "zm parity: --trainer-tp 4 must divide the model's num_key_value_heads=2"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    if argv[0] == "train":
        argv = [*argv, "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err
