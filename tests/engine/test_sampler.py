"""The sampler: per-request seeded draws that ignore the batch, and what the draws follow."""

import torch
from toy_model import ToyKernels

from zeromismatch.engine.sampler import Sampler, mix_seed, token_logprobs
from zeromismatch.engine.sampling_params import SamplingParams


def test_mix_seed_is_deterministic_and_spreads():
    assert mix_seed(7, 3) == mix_seed(7, 3)
    seeds = {mix_seed(s, i) for s in range(20) for i in range(20)}
    assert len(seeds) == 400 and all(0 <= s < 2**63 for s in seeds)


def test_draw_does_not_depend_on_batch_neighbours_or_row():
    sampler = Sampler(ToyKernels())
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 40, generator=gen)
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=i) for i in range(5)]
    full = sampler(logits, params, [11, 12, 13, 14, 15], [0, 3, 1, 7, 2])
    for row in range(5):
        alone = sampler(logits[row : row + 1], params[row : row + 1], [11 + row], [[0, 3, 1, 7, 2][row]])
        assert alone.token_ids[0] == full.token_ids[row]
        assert alone.logprobs[0] == full.logprobs[row]
    flipped = sampler(logits.flip(0), params[::-1], [15, 14, 13, 12, 11], [2, 7, 1, 3, 0])
    assert flipped.token_ids == full.token_ids[::-1]


def test_masked_tokens_are_never_drawn_and_greedy_is_argmax():
    sampler = Sampler(ToyKernels())
    logits = torch.randn(1, 30, generator=torch.Generator().manual_seed(1))
    top3 = set(torch.topk(logits[0], 3).indices.tolist())
    for index in range(200):
        out = sampler(logits, [SamplingParams(top_k=3)], [5], [index])
        assert out.token_ids[0] in top3
    greedy = sampler(logits, [SamplingParams(temperature=0.0)], [5], [0])
    assert greedy.token_ids[0] == int(torch.argmax(logits[0])) and greedy.logprobs[0] == 0.0


def test_draws_follow_the_processed_distribution():
    # 4000 draws over 6 tokens; tolerance 0.03 absolute per token frequency (~4 sigma at p=0.25).
    sampler = Sampler(ToyKernels())
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    params = SamplingParams(temperature=0.7, top_k=4)
    probs = (
        ToyKernels()
        .processed_log_softmax(logits, torch.tensor([0.7]), torch.tensor([4]), torch.tensor([1.0]))
        .exp()[0]
    )
    counts = torch.zeros(6)
    for index in range(4000):
        counts[sampler(logits, [params], [123], [index]).token_ids[0]] += 1
    assert torch.allclose(counts / 4000, probs, atol=0.03)
    assert counts[4] == 0 and counts[5] == 0


def test_raw_and_processed_logprobs_per_row():
    kernels = ToyKernels()
    logits = torch.randn(2, 10, generator=torch.Generator().manual_seed(2))
    tokens = torch.tensor([int(torch.argmax(logits[0])), int(torch.argmax(logits[1]))])
    params = [SamplingParams(temperature=0.5, logprobs_mode="processed"), SamplingParams(logprobs_mode="raw")]
    mixed = token_logprobs(kernels, logits, params, tokens)
    processed = kernels.processed_log_softmax(
        logits[:1], torch.tensor([0.5]), torch.tensor([0]), torch.tensor([1.0])
    )
    assert mixed[0] == processed[0, tokens[0]]
    assert mixed[1] == kernels.log_softmax(logits[1:])[0, tokens[1]]
    assert mixed[0] != kernels.log_softmax(logits[:1])[0, tokens[0]]
