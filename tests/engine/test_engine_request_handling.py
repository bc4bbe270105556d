"""How the engine handles requests at the edges:

- a seeded uniform draw of exactly 0 must not turn a greedy step into token 0 with logprob -inf;
- a failed forward ends the requests of that step with an error and leaves the engine serving;
- automatic request ids never collide with ids a caller chose; step-API requests that finish
  while ``generate`` runs are delivered by the next ``step()``;
- prefix-cache hit counters count only blocks actually served;
- the trainer recompute accepts the error outputs of empty prompts;
- two engines sharing one model object fail loudly instead of running on the other's kernels.
"""

import pytest
import torch
from toy_model import ToyKernels, ToyModel

from zeromismatch.engine import LLM, SamplingParams
from zeromismatch.engine.sampler import Sampler, mix_seed
from zeromismatch.train.logprobs import recompute_outputs

# mix_seed(586558, 0) seeds a generator whose 48-entry uniform row has U[37] == 0.0 exactly
ZERO_SEED, ZERO_AT, VOCAB = 586558, 37, 48


def _engine(**kwargs):
    config = dict(max_num_seqs=4, max_num_batched_tokens=16, block_size=4)
    config.update(kwargs)
    return LLM(ToyModel(), ToyKernels(), **config)


def test_the_zero_uniform_draw_is_real():
    generator = torch.Generator().manual_seed(mix_seed(ZERO_SEED, 0))
    row = torch.empty(VOCAB).uniform_(generator=generator)
    assert float(row[ZERO_AT]) == 0.0  # the premise of the next test


def test_greedy_step_with_a_zero_uniform_draw_keeps_the_argmax():
    logits = torch.zeros(1, VOCAB)
    logits[0, ZERO_AT] = 5.0
    sampler = Sampler(ToyKernels())
    greedy = SamplingParams(temperature=0.0, seed=ZERO_SEED)
    out = sampler(logits, [greedy], [ZERO_SEED], [0])
    assert out.token_ids == [ZERO_AT] and out.logprobs == [0.0]
    top1 = SamplingParams(temperature=1.0, top_k=1, seed=ZERO_SEED)
    out = sampler(logits, [top1], [ZERO_SEED], [0])
    assert out.token_ids == [ZERO_AT] and out.logprobs == [0.0]


class _FailingModel(ToyModel):
    """Raises in the forward whenever token 13 is in the batch."""

    def forward(self, batch, cache=None):
        if bool((batch.input_ids == 13).any()):
            raise RuntimeError("boom")
        return super().forward(batch, cache)


def test_a_failed_forward_ends_that_steps_requests_and_the_engine_keeps_serving():
    llm = LLM(_FailingModel(), ToyKernels(), max_num_seqs=4, max_num_batched_tokens=16, block_size=4)
    params = SamplingParams(max_tokens=3, seed=1)
    with pytest.warns(RuntimeWarning, match="engine step failed: RuntimeError: boom"):
        outputs = llm.generate([[1, 13, 2], [3, 4]], params)
    assert [o.finish_reason for o in outputs] == ["error", "error"]  # both shared the failed step
    assert "boom" in outputs[0].error
    assert not llm.has_unfinished()
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
    later = llm.generate([[3, 4]], params)[0]
    assert later.finish_reason == "length" and len(later.token_ids) == 3


def test_automatic_ids_skip_ids_a_caller_chose():
    llm = _engine()
    params = SamplingParams(max_tokens=2, seed=1)
    llm.add_request([1, 2, 3], params, request_id="0")
    output = llm.generate([[4, 5, 6]], params)[0]
    assert output.error is None and output.finish_reason == "length"


def test_step_api_requests_finishing_during_generate_reach_the_next_step():
    llm = _engine()
    llm.add_request([1, 2, 3], SamplingParams(max_tokens=2, seed=1), request_id="rollout-A")
    llm.generate([[4, 5, 6]], SamplingParams(max_tokens=8, seed=2))
    delivered = llm.step()
    assert [o.request_id for o in delivered] == ["rollout-A"]
    assert delivered[0].finished and len(delivered[0].token_ids) == 2


def test_prefix_hits_count_only_blocks_actually_served():
    llm = LLM(ToyModel(), ToyKernels(), block_size=4, num_blocks=8, max_num_seqs=4, max_num_batched_tokens=64)
    shared = list(range(1, 13))
    llm.generate([shared + [40]], SamplingParams(max_tokens=1, seed=0))  # caches 3 blocks
    # A holds 5 of the 8 blocks while B (3 cached blocks + 3 new ones) waits a step for room
    llm.add_request(list(range(20, 36)) + [1, 2, 3], SamplingParams(max_tokens=1, seed=1), request_id="A")
    llm.add_request(shared + list(range(40, 47)), SamplingParams(max_tokens=2, seed=2), request_id="B")
    outputs = {}
    waited = False
    while llm.has_unfinished():
        for output in llm.step():
            outputs[output.request_id] = output
        waited |= bool(llm.scheduler.waiting)
    assert waited  # the admission of B failed at least once
    served = sum(o.num_cached_tokens // 4 for o in outputs.values())
    assert served == 3 and llm.prefix_cache_hits() == served


def test_recompute_accepts_error_outputs_of_empty_prompts():
    model = ToyModel()
    llm = _engine()
    outputs = llm.generate([[1, 2, 3], [], [99]], SamplingParams(max_tokens=3, seed=1))
    assert [o.finish_reason for o in outputs] == ["length", "error", "error"]
    recomputed = recompute_outputs(model, outputs, kernels=ToyKernels())
    assert [len(r) for r in recomputed] == [3, 0, 0]


def test_engines_sharing_a_model_object_fail_loudly_not_on_the_wrong_kernels():
    """LLM(model_object, kernels) sets the object's kernel set; a second engine given the same object
    switches it. The first engine must then refuse to step rather than run its forward on the
    second engine's kernels (its sampler and its trainer would still use its own)."""
    from zeromismatch.engine.llm import build_preset

    model = build_preset("tiny-qwen3", "aligned", torch.float32, 0)
    first = LLM(model, "aligned", max_num_seqs=2, block_size=4)
    LLM(model, "default", max_num_seqs=2, block_size=4)
    with pytest.warns(RuntimeWarning, match="must not share a model object"):
        out = first.generate([[1, 2, 3]], SamplingParams(max_tokens=2, seed=1))[0]
    assert out.finish_reason == "error"
