"""The RL learner trains on the Megatron model at tensor-parallel degree 2 (two spawned gloo ranks):
supervised steps, then on-policy RL steps, with the TP-group gradient norm and clipping of
``MegatronCausalLM.clip_grad_norm_``. Every RL step's kernel mismatch is exactly 0 (the TP 2 forward
is bitwise the engine's), and from the same weights TP 2 trains as TP 1 does, to fp32 rounding.

Why not bitwise TP 1: the backward's cross-rank sums reorder fp32 additions (test_megatron_tp.py).
Training then amplifies that rounding: over 20 SFT steps at lr 1e-3 the two degrees' losses part
from 2e-7 (step 2) to 5e-4 (step 20), and after that their sampled episodes differ. So the RL steps
are compared from one start (TP 1's post-SFT weights, given to both) over a few steps, and the SFT
losses over the first steps only."""

from __future__ import annotations

import pytest
from megatron_helpers import tp_learner_steps

from zeromismatch.engine.tp import run_spmd
from zeromismatch.rl import RLConfig

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

RL_STEPS = 3
CONFIG = RLConfig(
    env="arithmetic", trainer="megatron", steps=RL_STEPS, prompts_per_step=4, group_size=4, max_new_tokens=4,
    sft_steps=20, env_options={"max_digits": 1}, micro_batch_size=4, grad_clip=0.05,
).to_dict()  # fmt: skip
#: relative gap allowed between TP 1 and TP 2 for a loss or a gradient norm (fp32 rounding of sums)
RTOL = 1e-5
#: the largest |TP 2 - TP 1| weight gap allowed, as a share of the largest weight change RL made
GAP = 1e-3


@pytest.fixture(scope="module")
def runs():
    tp1 = tp_learner_steps(0, None, CONFIG, RL_STEPS)
    tp2 = run_spmd(tp_learner_steps, 2, CONFIG, RL_STEPS, tp1["start"])
    return tp1, tp2


def test_tp2_rl_steps_have_exactly_zero_kernel_mismatch(runs):
    _, tp2 = runs
    assert [s["k3_kl"] for s in tp2["steps"]] == [0.0] * RL_STEPS
    assert all(s["diff_max"] == 0.0 and s["kernel_identical"] for s in tp2["steps"])
    assert any(s["reward_mean"] > 0 for s in tp2["steps"])  # the advantages are not all zero
    assert tp2["default_k3"] > 0  # inverse: the learner on the default set at TP 2


def test_tp2_sft_trains_as_tp1_does(runs):
    tp1, tp2 = runs
    assert tp2["sft_losses"][0] == tp1["sft_losses"][0]  # the first forward is bitwise TP 1's
    early = zip(tp1["sft_losses"][:5], tp2["sft_losses"][:5])
    assert all(abs(a - b) <= RTOL * a for a, b in early)
    assert tp2["sft_losses"][-1] < 0.5 * tp2["sft_losses"][0]


def test_tp2_rl_steps_track_tp1_from_the_same_weights(runs):
    tp1, tp2 = runs
    first1, first2 = tp1["steps"][0], tp2["steps"][0]
    assert first2["loss"] == first1["loss"]  # same weights, same episodes: the forward is bitwise
    norms = [(a["grad_norm_preclip"], b["grad_norm_preclip"]) for a, b in zip(tp1["steps"], tp2["steps"])]
    assert all(abs(a - b) <= RTOL * a for a, b in norms), norms
    assert all(a > CONFIG["grad_clip"] for a, _ in norms)  # clipping acted at every step
    start = tp1["start"]
    moved = max(float((tp1["state"][k] - start[k]).abs().max()) for k in start)
    gap = max(float((tp1["state"][k] - tp2["state"][k]).abs().max()) for k in start)
    assert moved > 0 and gap <= GAP * moved, (gap, moved)
