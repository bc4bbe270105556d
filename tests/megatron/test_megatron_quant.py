"""The Megatron learner's fake-quantized forward (``integrations/megatron/quantized.py``): with a weight
format (fp8, fp8-block, nvfp4) its logprobs equal the project's fake-quantized trainer's and the
quantized engine's bit for bit, every family, fp32 and bf16, the aligned and aligned-native sets, TP 1
(quantization is TP 1 only, as in the project). Inverses: the dense Megatron learner, and the Megatron
learner on another format, both differ from the quantized engine. It fake-quantizes exactly the HF
tensors the project's ``fake_quantize_model`` does, and its gradient is the project's straight-through
one."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from megatron_helpers import DTYPES, grad_gap, hf_grads, loss_of, sequences

from zeromismatch.cli import main
from zeromismatch.engine import LLM
from zeromismatch.integrations.megatron import build_megatron_model, from_causal_lm
from zeromismatch.models import QUANT_FORMATS, build_model, fake_quantize_model, quantize_model
from zeromismatch.parity import make_workload, run_engine_workload
from zeromismatch.rl import RLConfig
from zeromismatch.rl.learner import Learner, build_policy, weights_hash
from zeromismatch.train.logprobs import recompute_outputs

pytestmark = pytest.mark.megatron

KERNELS = ["aligned", pytest.param("aligned-native", marks=pytest.mark.native)]
PRESETS = ["tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-nemotron-h"]  # every family
SAMPLING = dict(temperature=0.9, top_k=40, top_p=0.95, max_tokens=6)
#: Megatron vs project gradients, relative to each tensor's largest: the forward is bitwise, the
#: backward is not, with or without a format (stock torch GEMM backward on Megatron's fused q/k/v and
#: gate/up weights, Megatron's own autograd ops), so fp32 sums are reordered (measured: at most
#: 8.6e-7 with a format, 1.2e-6 dense)
GRAD_RTOL = 1e-5


def _flat(logprobs) -> torch.Tensor:
    return torch.cat([torch.as_tensor(lp, dtype=torch.float32) for lp in logprobs])


def _quantized_engine_outputs(preset: str, kernels: str, dtype: torch.dtype, fmt: str):
    engine = quantize_model(build_model(preset, kernels=kernels, dtype=dtype, seed=0), fmt)
    llm = LLM(engine, kernels, max_num_seqs=3, max_num_batched_tokens=24, prefill_chunk=7, block_size=8)
    return run_engine_workload(llm, make_workload(0, 5, 512, 24, SAMPLING))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("fmt", QUANT_FORMATS)
@pytest.mark.parametrize("preset", PRESETS)
def test_fake_quantized_megatron_equals_trainer_equals_quantized_engine(preset, fmt, kernels, dtype):
    project = fake_quantize_model(build_model(preset, kernels=kernels, dtype=DTYPES[dtype], seed=0), fmt)
    megatron = from_causal_lm(project)
    assert megatron.fake_quant_format == fmt
    outputs = _quantized_engine_outputs(preset, kernels, DTYPES[dtype], fmt)
    engine = _flat(o.logprobs for o in outputs)
    trainer = _flat(recompute_outputs(project, outputs, micro_batch_size=2))
    learner = _flat(recompute_outputs(megatron, outputs, micro_batch_size=3, order=[4, 2, 0, 1, 3]))
    assert engine.numel() == 30 and bool((engine != 0).any())
    assert torch.equal(learner, engine) and torch.equal(trainer, engine)
    # inverses: the dense Megatron learner (the same masters, no format), and another format
    dense = from_causal_lm(build_model(preset, kernels=kernels, dtype=DTYPES[dtype], seed=0))
    assert float((_flat(recompute_outputs(dense, outputs)) - engine).abs().max()) > 0
    other = QUANT_FORMATS[(QUANT_FORMATS.index(fmt) + 1) % len(QUANT_FORMATS)]
    wrong = build_megatron_model(preset, kernels, DTYPES[dtype], seed=0, quant=other)
    assert float((_flat(recompute_outputs(wrong, outputs)) - engine).abs().max()) > 0


def _project_quantized_names(model) -> set[str]:
    names = set()
    for module in model.modules():
        quantizers = getattr(module, "fake_quant", None)
        for q in quantizers.values() if isinstance(quantizers, dict) else [quantizers]:
            if q is not None:
                names.update(f"{n}.weight" for n in ((q.name,) if isinstance(q.name, str) else q.name))
    return names


@pytest.mark.parametrize("preset", PRESETS)
def test_it_fake_quantizes_exactly_the_tensors_the_project_does(preset):
    project = fake_quantize_model(build_model(preset, kernels="aligned", seed=0), "fp8")
    megatron = from_causal_lm(project)
    chosen = set()
    for module in megatron.gpt.modules():
        for q in (getattr(module, "fake_quant", None) or {}).values():
            chosen.update(q.map.hf)
    expected = _project_quantized_names(project)
    assert chosen == expected and len(expected) > 0
    assert "lm_head.weight" not in chosen and not any("norm" in n or ".gate." in n for n in chosen)


def _project_grads(model) -> dict[str, torch.Tensor]:
    out = {}
    for entry in model._hf_entries():  # HF name -> (module, attr, expert) of the project's model
        grad = getattr(entry.module, entry.attr).grad
        if grad is not None:
            out[entry.name] = grad[entry.expert] if entry.expert is not None else grad
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_the_gradient_is_the_projects_straight_through_one(preset):
    seqs = sequences()
    project = fake_quantize_model(build_model(preset, kernels="aligned", seed=0), "nvfp4")
    megatron = from_causal_lm(project)
    loss_of(project, seqs).backward()
    loss_of(megatron, seqs).backward()
    ours, theirs = hf_grads(megatron), _project_grads(project)
    assert sorted(ours) == sorted(theirs)
    absolute, relative = grad_gap(theirs, ours)
    assert relative < GRAD_RTOL, (absolute, relative)
    # inverse: the dense learner's gradient is another one (its forward differs)
    dense = from_causal_lm(build_model(preset, kernels="aligned", seed=0))
    loss_of(dense, seqs).backward()
    assert grad_gap(theirs, hf_grads(dense))[1] > 100 * GRAD_RTOL


def test_an_rl_run_with_a_weight_format_has_zero_mismatch(tmp_path):
    argv = ["train", "--trainer", "megatron", "--model", "tiny-qwen3-moe", "--stack", "aligned-fp8-block",
            "--steps", "2", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3",
            "--eval-size", "2", "--eval-samples", "0", "--quiet", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["trainer"], config["quant"]) == ("megatron", "fp8-block")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["k3_kl"] for r in records] == [0.0, 0.0] and [r["diff_max"] for r in records] == [0.0, 0.0]


def test_the_learner_and_its_shadow_keep_the_format_and_the_masters():
    tiny = dict(env="arithmetic", steps=1, prompts_per_step=2, group_size=2, max_new_tokens=4, eval_size=2,
                eval_samples=1, micro_batch_size=4)  # fmt: skip
    config = RLConfig(trainer="megatron", quant="nvfp4", **tiny)
    learner = Learner(config)
    assert learner.model.fake_quant_format == "nvfp4"
    # the masters are the dense weights, what the project's fake-quantized learner holds
    assert weights_hash(learner.model) == weights_hash(build_policy(config.replace(trainer="zeromismatch")))
    twin = copy.deepcopy(learner.model)
    assert twin.fake_quant_format == "nvfp4" and weights_hash(twin) == weights_hash(learner.model)
    seqs = sequences(vocab=learner.model.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(loss_of(twin, seqs), loss_of(learner.model, seqs))
    before = weights_hash(learner.model)
    assert learner.sft_step([([1, 5, 9], [4, 2, 3], [True, True, True])], lr=1e-2) > 0
    assert weights_hash(learner.model) != before  # the straight-through gradient reached the masters


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(quant="int4"), r"^unknown quantization format 'int4'; expected one of"),
        (dict(quant="fp8", tp_size=2), r"^the Megatron learner's fp8 fake quantization needs TP degree 1"),
    ],
)
def test_a_format_it_cannot_run_is_one_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_megatron_model("tiny-qwen3", "aligned", torch.float32, seed=0, **kwargs)


def test_an_nvfp4_shape_is_refused_as_the_project_refuses_it():
    overrides = {"intermediate_size": 24}  # the down projection's input dim is not a multiple of 16
    project = build_model({**_preset("tiny-qwen3"), **overrides}, kernels="aligned", seed=0)
    with pytest.raises(ValueError) as theirs:
        fake_quantize_model(project, "nvfp4")
    megatron = from_causal_lm(project)
    with pytest.raises(ValueError) as ours:
        build_megatron_model(megatron.config, "aligned", torch.float32, seed=0, quant="nvfp4")
    assert str(ours.value) == str(theirs.value) and "down_proj" in str(ours.value)
    assert megatron.fake_quant_format is None


def _preset(name: str) -> dict:
    from zeromismatch.models import preset_dict

    return preset_dict(name)
