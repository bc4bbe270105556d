"""Tensor parallelism (world size 2, gloo on CPU, torch.multiprocessing spawn).

With the aligned kernels the TP=2 logits -- trainer mode, and engine mode over a paged cache
-- equal the TP=1 trainer logits bit for bit for every family (row-parallel linears sum a
fixed number of virtual shards in one fixed tree whatever the TP degree). Inverse: the
default kernels (local GEMM + all_reduce) give different bits at TP=2 for some input, found
by a deterministic search over presets and seeds. The HF state dict gathered at TP=2 equals
the TP=1 one, and a TP=2 save loads at TP=1 unchanged.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zeromismatch.models import TINY_PRESETS, build_model, load_pretrained, save_pretrained

WORLD_SIZE = 2


def _logits(model, sequences):
    from model_helpers import trainer_logits

    with torch.no_grad():
        return trainer_logits(model, sequences)


def _worker(rank: int, tmp: str, results_file: str) -> None:
    sys.path.insert(0, os.path.dirname(__file__))
    from model_helpers import engine_logits, random_sequences

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=WORLD_SIZE)
    group = dist.group.WORLD
    results: dict[str, object] = {}
    try:
        for preset in TINY_PRESETS:
            tp1 = build_model(preset, kernels="aligned", seed=4)
            tp2 = build_model(preset, kernels="aligned", seed=4, tp_group=group)
            sequences = random_sequences([6, 9], tp1.config.vocab_size, seed=0)
            expected = _logits(tp1, sequences)
            results[f"{preset}/aligned_equal"] = torch.equal(expected, _logits(tp2, sequences))
            with torch.no_grad():
                engine_tp2 = engine_logits(tp2, sequences, [4, 1])
            results[f"{preset}/engine_equal"] = torch.equal(expected, engine_tp2)
            full, gathered = tp1.state_dict_hf(), tp2.state_dict_hf()
            results[f"{preset}/state_dict_equal"] = full.keys() == gathered.keys() and all(
                torch.equal(full[k], gathered[k]) for k in full
            )
            save_pretrained(tp2, os.path.join(tmp, preset))
            dist.barrier()
            reloaded = load_pretrained(os.path.join(tmp, preset), kernels="aligned")
            results[f"{preset}/reload_equal"] = all(
                torch.equal(v, reloaded.state_dict_hf()[k]) for k, v in full.items()
            )
        # inverse: default kernels at TP=2 differ from TP=1 for some seed (deterministic search)
        # (MKL happens to give the same bits for a K=256 GEMM split in two halves, so the search
        # runs over presets too: the 64-wide shared-expert down_proj splits differently)
        differs = None
        for preset, seed in [(p, s) for p in TINY_PRESETS for s in range(3)]:
            tp1 = build_model(preset, kernels="default", seed=seed)
            tp2 = build_model(preset, kernels="default", seed=seed, tp_group=group)
            sequences = random_sequences([6, 9], tp1.config.vocab_size, seed=seed)
            if not torch.equal(_logits(tp1, sequences), _logits(tp2, sequences)):
                differs = f"{preset}/{seed}"
                break
        results["default_differs_at"] = differs
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(results_file, "w") as handle:
            json.dump(results, handle)


@pytest.mark.slow
def test_tensor_parallel_two_ranks(tmp_path):
    results_file = str(tmp_path / "results.json")
    mp.spawn(_worker, args=(str(tmp_path), results_file), nprocs=WORLD_SIZE, join=True)
    with open(results_file) as handle:
        results = json.load(handle)
    for preset in TINY_PRESETS:
        assert results[f"{preset}/aligned_equal"] is True, preset
        assert results[f"{preset}/engine_equal"] is True, preset
        assert results[f"{preset}/state_dict_equal"] is True, preset
        assert results[f"{preset}/reload_equal"] is True, preset
    assert results["default_differs_at"] is not None


def test_tp_degree_must_divide_heads():
    class FakeGroup:
        pass

    from zeromismatch.models.tp import TensorParallel

    tp = TensorParallel(group=FakeGroup(), rank=0, world_size=3)
    with pytest.raises(
        ValueError, match="num_attention_heads=4 is not divisible by the tensor-parallel degree 3"
    ):
        tp.local_size(4, "num_attention_heads")
