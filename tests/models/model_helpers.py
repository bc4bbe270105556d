"""Shared helpers for the model tests: HF reference models, engine-mode schedules."""

from __future__ import annotations

import math

import torch

from zeromismatch.models import PRESETS, CausalLM, ForwardBatch


def hf_model_from_preset(name: str, seed: int = 0):
    """A transformers model (random init, fp32, eval) with the same config.json as our preset."""
    import transformers

    config = dict(PRESETS[name])
    model_type = config.pop("model_type")
    config.pop("architectures")
    hf_config = transformers.AutoConfig.for_model(model_type, **config)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(hf_config).eval()


def random_sequences(lengths, vocab: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]


def trainer_logits(model: CausalLM, sequences: list[torch.Tensor]) -> torch.Tensor:
    batch = ForwardBatch.for_training(sequences)
    return model.compute_logits(model(batch))


def engine_logits(
    model: CausalLM,
    sequences: list[torch.Tensor],
    chunk_sizes: list[int],
    block_size: int = 4,
    seed: int = 0,
) -> torch.Tensor:
    """Run ``sequences`` through engine mode: sequence s is fed ``chunk_sizes[s]`` tokens per step
    (a chunked prefill when > 1, decode-like steps when 1), all active sequences batched together
    every step, over a paged cache whose blocks are handed out in a shuffled order. Returns the
    per-token logits in the same packed order as ``trainer_logits``."""
    num_seqs = len(sequences)
    blocks_per_seq = math.ceil(max(s.numel() for s in sequences) / block_size)
    num_blocks = num_seqs * blocks_per_seq + 3
    gen = torch.Generator().manual_seed(seed)
    block_table = torch.randperm(num_blocks, generator=gen)[: num_seqs * blocks_per_seq].view(num_seqs, -1)
    state_slots = torch.randperm(num_seqs + 2, generator=gen)[:num_seqs]
    cache = model.allocate_cache(num_blocks, block_size, max_seqs=num_seqs + 2)
    done = [0] * num_seqs
    per_seq: list[list[torch.Tensor]] = [[] for _ in range(num_seqs)]
    while any(done[s] < sequences[s].numel() for s in range(num_seqs)):
        active = [s for s in range(num_seqs) if done[s] < sequences[s].numel()]
        ids, positions, q_lens, kv_lens, slots = [], [], [], [], []
        for s in active:
            n = min(chunk_sizes[s], sequences[s].numel() - done[s])
            pos = torch.arange(done[s], done[s] + n)
            ids.append(sequences[s][done[s] : done[s] + n])
            positions.append(pos)
            q_lens.append(n)
            kv_lens.append(done[s] + n)
            slots.append(block_table[s, pos // block_size] * block_size + pos % block_size)
        cu = torch.zeros(len(active) + 1, dtype=torch.int64)
        cu[1:] = torch.cumsum(torch.tensor(q_lens), 0)
        batch = ForwardBatch(
            input_ids=torch.cat(ids),
            positions=torch.cat(positions),
            cu_seqlens_q=cu,
            kv_lens=torch.tensor(kv_lens),
            block_table=block_table[active],
            slot_mapping=torch.cat(slots),
            state_slots=state_slots[active],
            has_initial_state=torch.tensor([done[s] > 0 for s in active]),
        )
        logits = model.compute_logits(model(batch, cache))
        for i, s in enumerate(active):
            per_seq[s].append(logits[int(cu[i]) : int(cu[i + 1])])
            done[s] += q_lens[i]
    return torch.cat([torch.cat(chunks) for chunks in per_seq])
