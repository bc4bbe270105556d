"""Megatron learner logprobs == the project trainer's == the engine's, bitwise, at TP 1: packed (thd)
and right-padded (sbhd) inputs, fp32 and bf16, the aligned and aligned-native sets. Inverses: the
same Megatron model on the default set, and Megatron's own stock local spec, both differ."""

from __future__ import annotations

import pytest
import torch
from megatron_helpers import (
    DTYPES,
    packed_logits,
    right_padded,
    sequences,
    stock_padded_logits,
    unpad,
)

from zeromismatch.engine import LLM
from zeromismatch.integrations.megatron import build_megatron_model, from_causal_lm
from zeromismatch.models import build_model
from zeromismatch.parity import make_workload, run_engine_workload
from zeromismatch.train.logprobs import recompute_outputs

pytestmark = pytest.mark.megatron

KERNELS = ["aligned", pytest.param("aligned-native", marks=pytest.mark.native)]
PRESETS = ["tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-nemotron-h"]  # every family
SAMPLING = dict(temperature=0.9, top_k=40, top_p=0.95, max_tokens=6)


def _engine_outputs(model, kernels: str, seed: int = 0):
    llm = LLM(model, kernels, max_num_seqs=3, max_num_batched_tokens=24, prefill_chunk=7, block_size=8)
    return run_engine_workload(llm, make_workload(seed, 5, 512, 24, SAMPLING))


def _flat(logprobs) -> torch.Tensor:
    return torch.cat([torch.as_tensor(lp, dtype=torch.float32) for lp in logprobs])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("preset", PRESETS)
def test_megatron_equals_trainer_equals_engine(preset, kernels, dtype):
    project = build_model(preset, kernels=kernels, dtype=DTYPES[dtype], seed=0)
    megatron = from_causal_lm(project)
    outputs = _engine_outputs(project, kernels)
    engine = _flat(o.logprobs for o in outputs)
    trainer = _flat(recompute_outputs(project, outputs, micro_batch_size=2))
    learner = _flat(recompute_outputs(megatron, outputs, micro_batch_size=3, order=[4, 2, 0, 1, 3]))
    assert engine.numel() == 30 and bool((engine != 0).any())
    assert torch.equal(learner, engine) and torch.equal(trainer, engine)
    # inverse: the same Megatron model and weights on the default set
    default = _flat(recompute_outputs(megatron, outputs, micro_batch_size=3, kernels="default"))
    assert float((default - engine).abs().max()) > 0
    assert megatron.kernels.name == kernels  # the recompute hands the model its own set back


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("preset", PRESETS)
def test_padded_sbhd_and_packed_thd_logits_equal_the_project_trainer(preset, kernels, dtype):
    seqs = sequences(seed=1)
    project = build_model(preset, kernels=kernels, dtype=DTYPES[dtype], seed=2)
    megatron = from_causal_lm(project)
    reference = packed_logits(project, seqs)
    assert torch.equal(packed_logits(megatron, seqs), reference)
    with torch.no_grad():  # GPTModel.forward end to end, right-padded, padding token 7
        padded = megatron.padded_logits(right_padded(seqs, pad=7))
    assert torch.equal(unpad(padded, seqs), reference)
    megatron.set_kernels("default")  # inverse
    with torch.no_grad():
        default = unpad(megatron.padded_logits(right_padded(seqs, pad=7)), seqs)
    assert float((default - reference).abs().max()) > 0


@pytest.mark.parametrize("overrides", [{}, {"q_lora_rank": None, "rope_interleave": False}])
def test_deepseek_mla_variants_and_the_router_correction_bias(overrides):
    # the correction bias only selects experts (a zero bias in the random init would not show it
    # is read), and MLA without the q low-rank path / without the interleaved RoPE layout
    from zeromismatch.models import preset_dict

    config = {**preset_dict("tiny-deepseek-v3"), **overrides}
    project = build_model(config, seed=4)
    state = project.state_dict_hf()
    gen = torch.Generator().manual_seed(0)
    for name in [n for n in state if n.endswith("e_score_correction_bias")]:
        state[name] = torch.randn(state[name].shape, generator=gen)
    project.load_state_dict_hf(state)
    megatron = from_causal_lm(project)
    seqs = sequences(seed=6)
    reference = packed_logits(project, seqs)
    assert torch.equal(packed_logits(megatron, seqs), reference)
    unbiased = {**state, **{n: torch.zeros_like(t) for n, t in state.items() if "correction" in n}}
    megatron.load_state_dict_hf(unbiased)  # inverse: the bias changes which experts run
    assert float((packed_logits(megatron, seqs) - reference).abs().max()) > 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the stock modules' own deprecation notices
def test_megatron_stock_local_spec_differs_on_the_same_weights():
    # Megatron's own modules (torch norms and linears, its RoPE and softmax attention), same weights
    seqs = sequences(seed=4, lengths=(9, 9))
    stock = build_megatron_model("tiny-qwen3", seed=0, stock_spec=True)
    kernel_spec = build_megatron_model("tiny-qwen3", seed=0)
    reference = packed_logits(build_model("tiny-qwen3", seed=0), seqs)
    gap = float((stock_padded_logits(stock, seqs) - reference).abs().max())
    assert 0 < gap < 1e-4
    assert torch.equal(packed_logits(kernel_spec, seqs), reference)


@pytest.mark.parametrize(
    "preset", [*PRESETS[:2], *(pytest.param(p, marks=pytest.mark.slow) for p in PRESETS[2:])]
)
def test_zm_parity_trainer_megatron_prints_exact_zeros(capsys, preset):
    from zeromismatch.cli import main

    assert main(["parity", "--model", preset, "--trainer", "megatron", "--num-prompts", "4",
                 "--max-tokens", "5", "--json"]) == 0  # fmt: skip
    import json

    result = json.loads(capsys.readouterr().out)
    assert result["identical"] and result["diff_max"] == 0.0 and result["k3_kl"] == 0.0
    assert result["trainer"] == "megatron" and result["tokens"] == 20
    assert main(["parity", "--model", preset, "--trainer", "megatron", "--kernels", "default",
                 "--num-prompts", "4", "--max-tokens", "5", "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert not result["identical"] and result["diff_max"] > 0


@pytest.mark.parametrize("quant", ["fp8", "fp8-block", "nvfp4"])
def test_zm_parity_trainer_megatron_with_a_weight_format_prints_exact_zeros(capsys, quant):
    """Both sides in one weight format: the Megatron learner fake-quantizes its masters as the engine
    quantizes its weights; inverse: the same format on the engine only (a dense learner) differs."""
    import json

    from zeromismatch.cli import main

    common = ["parity", "--model", "tiny-qwen3", "--trainer", "megatron", "--num-prompts", "4",
              "--max-tokens", "5", "--json"]  # fmt: skip
    assert main([*common, "--quant", quant]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["identical"] and result["diff_max"] == 0.0 and result["k3_kl"] == 0.0
    assert main([*common, "--rollout-quant", quant]) == 0
    result = json.loads(capsys.readouterr().out)
    assert not result["identical"] and result["diff_max"] > 0
