"""The bisector on every model family: aligned vs aligned finds nothing (and compared
everything); default vs default finds a divergence (the inverse); a one-ulp perturbation of
any op kind at any layer is found exactly there."""

from __future__ import annotations

import pytest
import torch
from bisect_helpers import OPS_BY_PRESET, PRESETS, baseline, called_ops, config, last_layer_calling

from zeromismatch.bisect import KERNEL_OPS, format_text, run_bisect
from zeromismatch.bisect.recorder import canonical_op, site_op


def _schedule_kinds(result) -> set[str]:
    kinds = set()
    for forward in result.rollout.forwards:
        if len(forward["chunks"]) > 1:
            kinds.add("mixed batch")
        for chunk in forward["chunks"]:
            if chunk["start"] > 0 and chunk["tokens"] == 1:
                kinds.add("decode")
            elif chunk["start"] > 0:
                kinds.add("prefill chunk")
    return kinds


@pytest.mark.parametrize("preset", PRESETS)
def test_aligned_vs_aligned_reports_no_divergence(preset):
    result = baseline(preset)
    cmp = result.comparison
    assert result.first is None and not result.diverged
    assert "no divergence" in format_text(result)
    # not vacuous: every trainer call was matched, every row of it found on the engine side
    engine_ops, trainer_ops = called_ops(result)
    assert trainer_ops == OPS_BY_PRESET[preset]
    assert engine_ops == OPS_BY_PRESET[preset] - {"attention"} | {"paged_attention"}
    assert cmp.unaligned_trainer_calls == 0 and not cmp.trainer_only_sites and not cmp.engine_only_sites
    assert len(cmp.sites) == len(result.trainer.records)
    assert all(s.rows_compared > 0 and s.rows_missing == 0 for s in cmp.sites)
    assert {canonical_op(s.op) for s in cmp.sites} == OPS_BY_PRESET[preset]
    assert _schedule_kinds(result) == {"mixed batch", "decode", "prefill chunk"}
    stats = result.logprob_stats
    assert stats["identical"] and stats["tokens"] == sum(len(r) for r in result.responses)
    assert stats["diff_max"] == stats["diff_mean"] == stats["diff_std"] == stats["k3_kl"] == 0.0


@pytest.mark.parametrize("preset", PRESETS)
def test_default_vs_default_diverges(preset):
    result = run_bisect(config(preset, "default", "default"))
    first = result.first
    assert first is not None
    assert first.rows_differing > 0 and first.max_abs_diff > 0
    assert first.inputs_identical is True  # the op itself diverges, not its inputs
    # nothing before the first divergence (trainer order) differs
    index = result.comparison.sites.index(first)
    assert not any(s.diverges for s in result.comparison.sites[:index])
    assert "FIRST DIVERGENCE" in format_text(result)


VARIANTS = [
    ("tiny-qwen3", dict(dtype="bf16")),
    ("tiny-qwen3-moe", dict(dtype="bf16", quant="fp8")),
    ("tiny-deepseek-v3", dict(dtype="bf16", quant="fp8")),
    ("tiny-nemotron-h", dict(dtype="bf16", quant="nvfp4")),
    ("tiny-qwen3", dict(temperature=0.7, top_k=20, top_p=0.9)),
    ("tiny-qwen3", dict(logprobs_mode="raw")),
    ("tiny-qwen3", dict(temperature=0.0)),
]


def _slow_if_nvfp4(overrides: dict) -> list:
    # NVFP4 dequantization makes these runs several seconds long
    return [pytest.mark.slow] if overrides.get("quant") == "nvfp4" else []


@pytest.mark.parametrize(
    "preset, overrides",
    [
        pytest.param(p, o, id=f"{p}-{'-'.join(map(str, o.values()))}", marks=_slow_if_nvfp4(o))
        for p, o in VARIANTS
    ],
)
def test_variants_aligned_clean_default_diverges(preset, overrides):
    aligned = run_bisect(config(preset, **overrides))
    assert aligned.first is None and aligned.logprob_stats["identical"]
    assert all(s.rows_missing == 0 for s in aligned.comparison.sites)
    default = run_bisect(config(preset, "default", "default", **overrides))
    assert default.first is not None and default.first.inputs_identical is True
    if overrides.get("top_k"):
        # random forced tokens mostly fall outside top-k/top-p: -inf on both sides, counted apart
        assert aligned.logprob_stats["nonfinite_tokens"] > 0
        assert "left out of the four statistics" in format_text(aligned)


def _perturb_cases():
    cases = [(preset, op, {}) for preset in PRESETS for op in sorted(OPS_BY_PRESET[preset])]
    cases += [
        ("tiny-qwen3", "paged_attention", {}),
        ("tiny-qwen3", "log_softmax", {"logprobs_mode": "raw"}),
        ("tiny-qwen3", "quant_linear", {"quant": "fp8"}),
        ("tiny-nemotron-h", "quant_linear", {"quant": "nvfp4"}),
        ("tiny-qwen3-moe", "moe_experts", {"dtype": "bf16"}),
    ]
    return cases


def test_perturbation_cases_cover_every_op_of_the_contract():
    assert {op for _, op, _ in _perturb_cases()} == set(KERNEL_OPS)


@pytest.mark.parametrize(
    "preset, op, overrides",
    [
        pytest.param(
            p,
            op,
            o,
            id=f"{p}-{op}{'-' + '-'.join(map(str, o.values())) if o else ''}",
            marks=_slow_if_nvfp4(o),
        )
        for p, op, o in _perturb_cases()
    ],
)
def test_perturbation_is_found_at_its_op_and_layer(preset, op, overrides):
    if overrides:
        reference = run_bisect(config(preset, **overrides))
        assert reference.first is None
    else:
        reference = baseline(preset)
    layer = last_layer_calling(reference, op)
    result = run_bisect(config(preset, perturb=f"{op}@{layer}", **overrides), trainer=reference.trainer)
    first, applied = result.first, result.rollout.perturbation
    assert applied is not None
    engine_call = result.rollout.records[applied["call_index"]]
    assert first is not None, f"{op}@{layer} was planted but not found"
    # planted on the engine side; a quantized engine's quant_linear is the fake-quantized learner's linear
    assert canonical_op(first.engine_op) == canonical_op(op) and site_op(first.op) == site_op(op)
    assert first.layer == layer
    assert first.path == engine_call.path and first.occurrence == engine_call.occurrence
    assert first.perturbed
    assert first.first_row == tuple(engine_call.row_keys[applied["row"]].tolist())
    assert first.inputs_identical is True
    # planted one ulp: the first differing op differs by exactly that element
    assert first.rows_differing == 1


def test_perturbation_of_an_op_the_model_does_not_call_is_one_clear_error():
    with pytest.raises(ValueError, match="never calls ssm_scan"):
        run_bisect(config("tiny-qwen3", perturb="ssm_scan@0"), trainer=baseline("tiny-qwen3").trainer)
    with pytest.raises(ValueError, match="never called at layer 7"):
        run_bisect(config("tiny-qwen3", perturb="linear@7"), trainer=baseline("tiny-qwen3").trainer)


def test_downstream_effect_is_reported_per_token_and_stays_in_the_perturbed_sequence():
    # Not every planted ulp reaches a sampled token's logprob (q at position 0 attends to one
    # key with softmax weight exactly 1; a bumped logit can vanish in the logsumexp), so
    # search the planting sites in a fixed order for one that does.
    reference = baseline("tiny-qwen3")
    ops = ("rms_norm", "attention", "silu_mul", "linear")
    candidates = [f"{op}@{layer}" for layer in (0, 1) for op in ops]
    for spec in candidates:
        result = run_bisect(config("tiny-qwen3", perturb=spec), trainer=reference.trainer)
        diffs = [t for t in result.token_diffs if not t["identical"]]
        if diffs:
            break
    else:
        pytest.fail(f"no planted ulp among {candidates} changed a token logprob")
    seq, position = result.first.first_row
    # it moves this sequence's logprobs at or after the planted position, no other sequence's
    assert {t["seq"] for t in diffs} == {seq}
    assert all(t["position"] >= position for t in diffs)
    stats = result.logprob_stats
    assert not stats["identical"] and stats["diff_max"] == max(abs(t["diff"]) for t in diffs) > 0
    assert f"differing {len(diffs)}" in format_text(result)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(model="no-such-model"), "no-such-model"),
        (dict(rollout="fast"), "unknown kernel set 'fast'"),
        (dict(dtype="fp16"), "dtype must be one of"),
        (dict(num_seqs=0), "num_seqs must be a positive int"),
        (dict(perturb="linear@x"), "layer must be"),
    ],
)
def test_bad_config_gives_one_clear_error(bad, message):
    kwargs = dict(model="tiny-qwen3")
    kwargs.update(bad)
    model = kwargs.pop("model")
    with pytest.raises(ValueError, match=message):
        run_bisect(config(model, **kwargs))


def test_result_json_is_serialisable():
    import json

    result = baseline("tiny-nemotron-h")
    text = json.dumps(result.to_dict())
    assert '"diverged": false' in text
    assert torch.cat(result.rollout.logprobs).numel() == len(result.to_dict()["token_diffs"])


def test_a_reused_trainer_run_must_match_every_setting_it_depends_on():
    """run_sides(trainer=...) compared only the kernel name and response lengths: a trainer run made at
    another temperature or dtype was accepted and reported false divergences (found by review)."""
    from zeromismatch.bisect.driver import run_sides

    reference = baseline("tiny-qwen3").trainer
    for overrides in ({"temperature": 0.7}, {"dtype": "bf16"}, {"top_k": 5}):
        with pytest.raises(ValueError, match="other settings"):
            run_sides(config("tiny-qwen3", **overrides), trainer=reference)
    # the perturbation and the rollout kernels are the rollout side's: reuse stays allowed
    run_sides(config("tiny-qwen3", perturb="silu_mul@1"), trainer=reference)
