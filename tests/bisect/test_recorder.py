"""RecordingKernels: a transparent KernelSet (same bits), complete, with correct attribution."""

from __future__ import annotations

import pytest
import torch
from bisect_helpers import PRESETS

from zeromismatch.bisect import KERNEL_OPS, Perturbation, RecordingKernels
from zeromismatch.bisect.compare import bits_equal, row_bits_differ
from zeromismatch.bisect.recorder import HEAD, layer_of
from zeromismatch.kernels.base import KernelSet
from zeromismatch.models import ForwardBatch, build_model


def test_every_kernelset_op_is_recorded_and_nothing_is_abstract():
    assert set(KERNEL_OPS) == set(KernelSet.__abstractmethods__)
    recorder = RecordingKernels("aligned")
    assert isinstance(recorder, KernelSet)
    for op in KERNEL_OPS:
        assert callable(getattr(recorder, op))
        assert getattr(type(recorder), op).__doc__ == getattr(KernelSet, op).__doc__


@pytest.mark.parametrize("preset", PRESETS)
def test_recording_is_bitwise_transparent_and_attributes_layers(preset):
    model = build_model(preset, kernels="aligned")
    gen = torch.Generator().manual_seed(1)
    sequences = [torch.randint(0, 512, (n,), generator=gen) for n in (5, 3)]
    batch = ForwardBatch.for_training(sequences)
    with torch.no_grad():
        plain = model.compute_logits(model.forward(batch))
        recorder = RecordingKernels("aligned")
        keys = torch.stack([torch.tensor([0] * 5 + [1] * 3), batch.positions], dim=1)
        recorder.expect_rows(keys, keys)
        with recorder.attach(model):
            recorded = model.compute_logits(model.forward(batch))
    assert torch.equal(plain, recorded)
    assert model.kernels.name == "aligned" and "forward" not in model.__dict__
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())

    records = recorder.records
    assert records and all(r.row_keys is not None for r in records)
    assert records[-1].op == "lm_head" and records[-1].path == "" and records[-1].layer == HEAD
    num_layers = len(model.decoder_layers)
    seen_layers = {r.layer for r in records if r.layer != HEAD}
    assert seen_layers == set(range(num_layers))
    for r in records:
        if r.layer != HEAD:
            assert f"layers.{r.layer}." in r.path + "."
    # the occurrence counter separates the two rope calls (q, then k) of one attention module
    ropes = [r for r in records if r.op == "rope" and r.layer == 0]
    if ropes:
        assert [r.occurrence for r in ropes] == list(range(len(ropes)))
        assert len({r.path for r in ropes}) == 1


def test_layer_of_parses_decoder_layer_paths():
    assert layer_of("model.layers.3.mlp.gate") == 3
    assert layer_of("backbone.layers.12.mixer") == 12
    assert layer_of("model.norm") == HEAD
    assert layer_of("") == HEAD
    assert layer_of("model.layersx.1") == HEAD


def test_perturbation_spec_parsing():
    assert Perturbation.parse("linear@1") == Perturbation("linear", 1)
    assert Perturbation.parse("rms_norm@head") == Perturbation("rms_norm", HEAD)
    assert Perturbation.parse("lm_head") == Perturbation("lm_head", None)
    assert Perturbation.parse(" paged_attention@0 ").op == "paged_attention"
    with pytest.raises(ValueError, match="unknown op 'matmul'"):
        Perturbation.parse("matmul@1")
    with pytest.raises(ValueError, match="layer must be"):
        Perturbation.parse("linear@x")
    with pytest.raises(ValueError, match="OP@LAYER"):
        Perturbation.parse("")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_perturbation_moves_exactly_one_element_one_ulp(dtype):
    out = torch.randn(4, 8).to(dtype)
    out[0, 0] = float("-inf")  # skipped: the first *finite* element is perturbed
    perturbation = Perturbation("linear", 0)
    bumped = perturbation.apply("linear", out)
    changed = row_bits_differ(out.reshape(-1, 1), bumped.reshape(-1, 1)).nonzero()[:, 0].tolist()
    assert changed == [1]
    assert bumped.view(-1)[1] == torch.nextafter(out.view(-1)[1], torch.tensor(float("inf"), dtype=dtype))
    assert bumped.view(-1)[1] > out.view(-1)[1]
    assert perturbation.applied_to["row"] == 0 and perturbation.applied_to["element"] == 1
    assert not perturbation.matches("linear", 0)  # applied once only


def test_perturbation_of_a_tuple_output_touches_the_floating_row_output():
    weights, ids = torch.rand(3, 2), torch.tensor([[0, 1], [1, 2], [2, 0]])
    bumped_weights, bumped_ids = Perturbation("moe_route", 1).apply("moe_route", (weights, ids))
    assert torch.equal(bumped_ids, ids)
    assert not bits_equal(bumped_weights, weights)


def test_expect_rows_rejects_bad_shapes():
    recorder = RecordingKernels("aligned")
    with pytest.raises(ValueError, match=r"\[T, 2\]"):
        recorder.expect_rows(torch.zeros(3, dtype=torch.int64), None)


def test_row_bits_differ_sees_signed_zero_and_dtype():
    a = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    b = torch.tensor([[-0.0, 1.0], [2.0, 3.0]])
    assert row_bits_differ(a, b).tolist() == [True, False]
    assert row_bits_differ(a, a.double()).all()
    assert not row_bits_differ(a, a.clone()).any()


def test_arguments_are_recorded_before_the_op_runs():
    """A kernel that writes into its input (a set under development) must have its input recorded as
    it was, not as the op left it (found by review: the report then blamed an upstream difference)."""
    from zeromismatch.kernels import get_kernels

    class InPlaceSilu(type(get_kernels("aligned"))):
        name = "aligned+in-place-silu-mul"

        def silu_mul(self, gate, up):
            out = super().silu_mul(gate, up)
            gate.copy_(out)
            return gate

    model = build_model("tiny-qwen3", kernels="aligned")
    batch = ForwardBatch.for_training([torch.arange(1, 6)])
    recorder = RecordingKernels(InPlaceSilu())
    with torch.no_grad(), recorder.attach(model):
        model.forward(batch)
    calls = [r for r in recorder.records if r.op == "silu_mul"]
    assert calls and all(not torch.equal(r.args["gate"], r.output) for r in calls)
