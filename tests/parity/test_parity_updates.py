"""Link 6: after ``update_weights``, every token recomputes bitwise with the weights of the
version that sampled it -- in all three modes -- and its inverse with default kernels; for every
preset in fp32 and bf16 activations and for the quantized (FP8/NVFP4) formats of their families."""

import pytest
import torch
from parity_helpers import PRESETS, dtype_quant_grid, engine, first_mismatch, logprobs_of, model, workload

from zeromismatch.models import quantize_model
from zeromismatch.train.logprobs import recompute_outputs

MODES = ("keep", "wait", "abort")


def new_weights(m, seed=1, scale=0.02):
    """Version 1: the current weights plus a small random step (an RL update, not a new model)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        n: t + scale * torch.randn(t.shape, generator=gen).to(t.dtype) for n, t in m.state_dict_hf().items()
    }


def run_with_update(llm, items, weights, mode, update_at_step=4, recompute_kv=True):
    """Staggered workload through the step API with one weight update at ``update_at_step``."""
    finished, pending, step = {}, list(enumerate(items)), 0
    while pending or llm.has_unfinished():
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, params) = pending.pop(0)
            llm.add_request(prompt, params, request_id=str(index))
        if step == update_at_step:
            for out in llm.update_weights(weights, mode=mode, recompute_kv=recompute_kv):
                finished[out.request_id] = out
        for out in llm.step():
            if out.finished:
                finished[out.request_id] = out
        step += 1
    return [finished[str(i)] for i in range(len(items))]


def per_version_equal(preset, kernels, outputs, weights_by_version, dtype="fp32", quant=None) -> bool:
    for version, weights in weights_by_version.items():
        trainer_model = model(preset, kernels, dtype, quant)
        trainer_model.load_state_dict_hf(weights)  # a quantized model re-quantizes the dense weights
        trainer = torch.cat(recompute_outputs(trainer_model, outputs, micro_batch_size=2))
        rollout_lp = logprobs_of(outputs)
        mask = torch.tensor([v == version for o in outputs for v in o.weight_versions], dtype=torch.bool)
        if not torch.equal(trainer[mask], rollout_lp[mask]):
            return False
    return True


def _scenario(
    preset, kernels, mode, seed=0, recompute_kv=True, dtype="fp32", quant=None, update_at_step=4, **work
):
    m = model(preset, kernels, dtype)
    # a quantized model exports no dense weights (state_dict_hf raises), so both versions are dense
    # HF tensors taken before quantizing -- the engine's update_weights re-quantizes them, as the
    # trainer's load_state_dict_hf does; quantize_model(model(...)) is exactly build_preset(quant=...)
    weights = {0: m.state_dict_hf(), 1: new_weights(m, seed + 1)}
    if quant is not None:
        quantize_model(m, quant)
    items = workload(seed, **{"num_prompts": 5, "max_tokens": 8, **work})
    outputs = run_with_update(
        engine(m, kernels), items, weights[1], mode, update_at_step=update_at_step, recompute_kv=recompute_kv
    )
    return outputs, weights


def _assert_covers_mode(outputs, mode):
    versions = {v for o in outputs for v in o.weight_versions}
    # both versions sampled tokens in every mode, so neither version's check runs on an empty mask
    assert versions == {0, 1}
    if mode == "keep":
        assert any(set(o.weight_versions) == {0, 1} for o in outputs)  # some request spans the update
    if mode == "wait":
        assert all(o.finish_reason == "length" for o in outputs)
    if mode == "abort":
        assert any(o.aborted for o in outputs) and any(not o.aborted for o in outputs)


def _modes_and_presets(fast_preset="tiny-qwen3"):
    return [
        pytest.param(p, mode, id=f"{p}-{mode}", marks=() if p == fast_preset else pytest.mark.slow)
        for p in PRESETS
        for mode in MODES
    ]


@pytest.mark.parametrize("preset, mode", _modes_and_presets())
def test_link6_tokens_recompute_with_their_versions_weights(preset, mode):
    outputs, weights = _scenario(preset, "aligned", mode)
    _assert_covers_mode(outputs, mode)
    assert per_version_equal(preset, "aligned", outputs, weights)


@pytest.mark.parametrize("preset, mode", _modes_and_presets())
def test_link6_inverse_default_kernels(preset, mode):
    found = None
    for seed in range(6):
        outputs, weights = _scenario(preset, "default", mode, seed=seed)
        if not per_version_equal(preset, "default", outputs, weights):
            found = seed
            break
    assert found is not None


# ---- bf16 activations and the quantized formats: the rest of the chain's grid ----
# The fp32 dense cases above run the 5-prompt, 8-token workload; the 7 (preset, dtype, quant)
# cases here x 3 modes use a smaller one (4 prompts of <= 12 tokens arriving at steps 0, 2, 4, 5,
# 5 tokens each, the update at step 3) so the whole grid stays cheap with the aligned GEMMs. It still
# has in every mode: chunked prefills (prompts of 8 and 10 > prefill_chunk 7), tokens of both versions, a
# request spanning the update ("keep", re-prefilled under version 1), drained ones ("wait"), aborted
# ones and one arriving after the update ("abort") -- asserted by _assert_covers_mode.
SMALL_WORKLOAD = dict(num_prompts=4, max_prompt_len=12, max_tokens=5, update_at_step=3)
BF16_AND_QUANTIZED = [case for case in dtype_quant_grid() if case[1:] != ("fp32", None)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "preset, dtype, quant",
    [pytest.param(*c, id=f"{c[0]}-{c[1]}-{c[2] or 'dense'}") for c in BF16_AND_QUANTIZED],
)
def test_link6_bf16_and_quantized(preset, dtype, quant, mode):
    outputs, weights = _scenario(preset, "aligned", mode, dtype=dtype, quant=quant, **SMALL_WORKLOAD)
    _assert_covers_mode(outputs, mode)
    assert per_version_equal(preset, "aligned", outputs, weights, dtype, quant)
    # and the update took effect on both sides (a quantized load that kept the old weights on the
    # engine and the trainer alike would pass the check above): version-1 tokens do not recompute
    # bitwise under version-0 weights
    assert not per_version_equal(preset, "aligned", outputs, {1: weights[0]}, dtype, quant)


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset, dtype, quant",
    [
        pytest.param("tiny-qwen3", "bf16", None, id="tiny-qwen3-bf16-dense"),
        pytest.param("tiny-nemotron-h", "bf16", "nvfp4", id="tiny-nemotron-h-bf16-nvfp4"),
    ],
)
def test_link6_bf16_and_quantized_inverse_default_kernels(preset, dtype, quant):
    # keep mode (the one that re-prefills in-flight requests); default kernels differed at every
    # seed 0-5 of this workload, in every mode and for every case of the grid, when this was written
    def differs(seed):
        outputs, weights = _scenario(
            preset, "default", "keep", seed, dtype=dtype, quant=quant, **SMALL_WORKLOAD
        )
        return not per_version_equal(preset, "default", outputs, weights, dtype, quant)

    assert first_mismatch(differs) is not None
