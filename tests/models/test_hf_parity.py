"""Parity with transformers (the pinned version): each family's tiny random-init HF model,
saved with ``save_pretrained`` and loaded by our loader, gives the same logits within the
stated fp32 tolerance; and a checkpoint *we* save loads into transformers unchanged.

Tolerance: max |logit difference| <= 1e-4 in fp32 (measured: about 5e-7 with every kernel set;
the remaining difference is summation order inside GEMMs/attention).
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import hf_model_from_preset, random_sequences, trainer_logits
from reference_kernels import ReferenceKernels

from zeromismatch.models import PRESETS, TINY_PRESETS, build_model, load_pretrained, save_pretrained

transformers = pytest.importorskip("transformers")

FP32_LOGIT_TOLERANCE = 1e-4
KERNEL_SETS = ["reference", "aligned", "default"]


def _kernels(name):
    return ReferenceKernels() if name == "reference" else name


def _hf_logits(hf_model, sequences):
    with torch.no_grad():
        return torch.cat([hf_model(seq[None]).logits[0] for seq in sequences])


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    """One transformers-saved checkpoint per family (saved once per module)."""
    out = {}
    for preset in TINY_PRESETS:
        hf_model = hf_model_from_preset(preset, seed=0)
        directory = tmp_path_factory.mktemp(preset)
        hf_model.save_pretrained(directory)
        out[preset] = (hf_model, directory)
    return out


@pytest.mark.parametrize("kernel_set", KERNEL_SETS)
@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_logits_match_transformers(hf_checkpoints, preset, kernel_set):
    hf_model, directory = hf_checkpoints[preset]
    ours = load_pretrained(directory, kernels=_kernels(kernel_set))
    sequences = random_sequences([9, 14, 3], hf_model.config.vocab_size, seed=1)
    with torch.no_grad():
        logits = trainer_logits(ours, sequences)
    expected = _hf_logits(hf_model, sequences)
    assert logits.dtype == torch.float32 and logits.shape == expected.shape
    diff = (logits - expected).abs().max().item()
    assert diff <= FP32_LOGIT_TOLERANCE, f"{preset}/{kernel_set}: max |diff| {diff:.3e}"
    # the comparison is not vacuous: logits vary by far more than the tolerance
    assert expected.std().item() > 100 * FP32_LOGIT_TOLERANCE


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_our_checkpoint_loads_in_transformers(tmp_path, preset):
    ours = build_model(preset, kernels=ReferenceKernels(), seed=3)
    save_pretrained(ours, tmp_path)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    hf_state = hf_model.state_dict()
    # every tensor we wrote landed in transformers' model with the same bits
    for name, tensor in ours.state_dict_hf().items():
        hf_name = name.replace("backbone.", "model.", 1) if preset == "tiny-nemotron-h" else name
        if hf_name in hf_state:
            assert torch.equal(hf_state[hf_name], tensor), name
    sequences = random_sequences([10, 4], ours.config.vocab_size, seed=2)
    with torch.no_grad():
        diff = (trainer_logits(ours, sequences) - _hf_logits(hf_model, sequences)).abs().max().item()
    assert diff <= FP32_LOGIT_TOLERANCE, f"{preset}: max |diff| {diff:.3e}"


VARIANTS = [
    ("tiny-qwen3", {"tie_word_embeddings": True, "attention_bias": True}),
    ("tiny-qwen3-moe", {"decoder_sparse_step": 2, "mlp_only_layers": [], "norm_topk_prob": False}),
    ("tiny-deepseek-v3", {"q_lora_rank": None, "rope_interleave": False, "n_group": 1, "topk_group": 1}),
    ("tiny-nemotron-h", {"moe_latent_size": 64, "hybrid_override_pattern": "ME*", "num_hidden_layers": 3}),
]


@pytest.mark.parametrize(("preset", "overrides"), VARIANTS)
def test_config_variants_match_transformers(tmp_path, preset, overrides):
    """Less common switches real checkpoints use: tied embeddings, attention bias, sparse steps,
    full-rank MLA queries, non-interleaved RoPE, Nemotron latent MoE."""
    config = dict(PRESETS[preset], **overrides)
    model_type = config.pop("model_type")
    config.pop("architectures")
    torch.manual_seed(0)
    hf_model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(model_type, **config)
    ).eval()
    with torch.no_grad():  # biases and routing correction biases start at zero: make them count
        for name, tensor in [*hf_model.named_parameters(), *hf_model.named_buffers()]:
            if name.endswith(("bias", "e_score_correction_bias")) and not bool(tensor.any()):
                tensor.normal_(0.0, 0.05)
    hf_model.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path, kernels=ReferenceKernels())
    sequences = random_sequences([8, 5], ours.config.vocab_size, seed=4)
    with torch.no_grad():
        diff = (trainer_logits(ours, sequences) - _hf_logits(hf_model, sequences)).abs().max().item()
    assert diff <= FP32_LOGIT_TOLERANCE, f"{preset} {overrides}: max |diff| {diff:.3e}"
