"""Link 4: the engine at TP 2 (spawned gloo workers) == the trainer at TP 1, and the trainer at
TP 2 == the engine at TP 1, for every preset in fp32 and bf16; inverse: default kernels differ
(every preset). Each ``run_parity`` call spawns its own workers (~5 s here, the run itself well
under 1 s), so these are slow tests."""

import os
import tempfile

import pytest
import torch
from parity_helpers import PRESETS, SAMPLING

from zeromismatch.engine import LLM, SamplingParams
from zeromismatch.parity import run_parity

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("preset", PRESETS)
def test_link4_engine_tp2_equals_trainer_tp1(preset, dtype):
    result = run_parity(
        preset, "aligned", seed=6, num_prompts=4, max_tokens=5, tp=2, trainer_tp=1, top_p=0.9, dtype=dtype
    )
    assert result["identical"] and result["diff_max"] == 0.0 and result["tokens"] == 20
    assert result["dtype"] == dtype


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("preset", PRESETS)
def test_trainer_tp2_equals_engine_tp1(preset, dtype):
    result = run_parity(
        preset, "aligned", seed=7, num_prompts=4, max_tokens=5, tp=1, trainer_tp=2, dtype=dtype
    )
    assert result["identical"] and result["k3_kl"] == 0.0 and result["dtype"] == dtype


@pytest.mark.parametrize("preset", PRESETS)
def test_link4_inverse_default_kernels(preset):
    # seeds 0-5 all differed on the default set for every preset, in fp32 and bf16 and both
    # directions (checked in session 15); the loop guards against one unlucky workload
    found = None
    for seed in range(4):
        result = run_parity(preset, "default", seed=seed, num_prompts=4, max_tokens=5, tp=2, trainer_tp=1)
        if not result["identical"]:
            found = seed
            break
    assert found is not None


def test_trainer_tp2_inverse_default_kernels():
    found = None
    for seed in range(4):
        result = run_parity(
            "tiny-qwen3", "default", seed=seed, num_prompts=4, max_tokens=5, tp=1, trainer_tp=2
        )
        if not result["identical"]:
            found = seed
            break
    assert found is not None


def test_tp_engine_step_api_update_and_bad_input():
    with LLM("tiny-qwen3", "aligned", tp=2, max_num_seqs=2, block_size=8) as llm:
        with pytest.raises(ValueError, match="empty"):
            llm.add_request([], SamplingParams(**SAMPLING))
        llm.add_request([1, 2, 3], SamplingParams(**SAMPLING, seed=1), request_id="a")
        llm.step()
        with pytest.raises(ValueError, match="unknown weight names"):
            llm.update_weights({"nope": None})
        assert llm.weight_version == 0
        outputs = []
        while llm.has_unfinished():
            outputs.extend(llm.step())
        assert outputs[-1].finished and len(outputs[-1].token_ids) == SAMPLING["max_tokens"]


def test_tp_engine_update_keep_recomputes_per_version():
    from parity_helpers import model, workload
    from test_parity_updates import new_weights, per_version_equal, run_with_update

    weights = {0: model("tiny-qwen3").state_dict_hf()}
    weights[1] = new_weights(model("tiny-qwen3"))
    items = workload(0, num_prompts=4, max_tokens=6)
    with LLM(
        "tiny-qwen3", "aligned", tp=2, max_num_seqs=3, max_num_batched_tokens=24, prefill_chunk=7
    ) as llm:
        outputs = run_with_update(llm, items, weights[1], "keep")
    assert {v for o in outputs for v in o.weight_versions} == {0, 1}
    assert per_version_equal("tiny-qwen3", "aligned", outputs, weights)


@pytest.mark.native
def test_link4_native_set_engine_tp2_equals_trainer_tp1():
    result = run_parity(
        "tiny-qwen3", "aligned-native", seed=6, num_prompts=4, max_tokens=5, tp=2, trainer_tp=1, top_p=0.9
    )
    assert result["identical"] and result["diff_max"] == 0.0 and result["tokens"] == 20


def test_tp_engine_says_once_that_a_hybrid_has_no_prefix_caching():
    """An explicit enable_prefix_caching=True on a hybrid: one warning in the caller's process (it
    went once per worker, to their stderr), then the engine serves without prefix caching."""
    ignored = "enable_prefix_caching=True is ignored: NemotronHForCausalLM"
    with pytest.warns(UserWarning, match=ignored) as seen:
        llm = LLM(
            "tiny-nemotron-h", "aligned", tp=2, enable_prefix_caching=True, max_num_seqs=2, block_size=8
        )
    with llm:
        assert len(seen) == 1 and seen[0].filename == __file__  # pointed at this call
        prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
        outputs = [llm.generate([prompt], SamplingParams(**SAMPLING, seed=s))[0] for s in (1, 2)]
        assert all(len(o.token_ids) == SAMPLING["max_tokens"] for o in outputs)
        assert llm.prefix_cache_hits() == 0


def _rank_one_fails(rank, group):
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    return rank


def _rank_one_dies(rank, group):
    if rank == 1:
        os._exit(3)  # no reply, no traceback: as a crash would
    torch.distributed.barrier(group=group)
    return rank


def test_tp_workers_rendezvous_in_a_private_directory_that_goes_with_them(monkeypatch, tmp_path):
    """Workers meet through a file in a fresh directory (no port picked and released, which another
    process could take in between); it is removed when they are gone, after a failure too."""
    from zeromismatch.engine.tp import run_spmd

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # a failure on a rank other than 0 is an error even when rank 0 has its result (it used to
    # be dropped: rank 0's reply was the only one read)
    with pytest.raises(RuntimeError, match="rank 1 fails on purpose"):
        run_spmd(_rank_one_fails, 2, timeout=120)
    with pytest.raises(RuntimeError, match="tensor-parallel worker"):
        run_spmd(_rank_one_dies, 2, timeout=120)
    with LLM("tiny-qwen3", "aligned", tp=2, max_num_seqs=2, block_size=8) as llm:
        assert [p.name[:6] for p in tmp_path.iterdir()] == ["zm-tp-"]  # the engine's, while it runs
        output = llm.generate([[1, 2, 3]], SamplingParams(**SAMPLING, seed=1))[0]
        assert len(output.token_ids) == SAMPLING["max_tokens"]
    assert list(tmp_path.iterdir()) == []
