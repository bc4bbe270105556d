"""Shared pieces of the Megatron-learner tests: inputs, the project's reference outputs, gradients in
HF names, and the tensor-parallel worker (run by ``engine.tp.run_spmd``)."""

from __future__ import annotations

import contextlib

import torch

from zeromismatch.models import ForwardBatch, build_model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LENGTHS = (7, 3, 12, 1)


def sequences(seed: int = 0, lengths=LENGTHS, vocab: int = 512) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]


def right_padded(seqs: list[torch.Tensor], pad: int = 0) -> torch.Tensor:
    """``[b, max_len]`` ids, each row one sequence followed by ``pad`` tokens."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def unpad(padded: torch.Tensor, seqs: list[torch.Tensor]) -> torch.Tensor:
    """The rows of ``padded [b, s, ...]`` that hold real tokens, packed in sequence order."""
    return torch.cat([padded[i, : len(s)] for i, s in enumerate(seqs)])


def packed_logits(model, seqs: list[torch.Tensor]) -> torch.Tensor:
    """Trainer-mode logits of a project ``CausalLM`` or a ``MegatronCausalLM`` (packed thd)."""
    with torch.no_grad():
        return model.compute_logits(model(ForwardBatch.for_training(seqs)))


def project_logits(preset: str, kernels: str, dtype: torch.dtype, seqs, seed: int = 0) -> torch.Tensor:
    return packed_logits(build_model(preset, kernels=kernels, dtype=dtype, seed=seed), seqs)


def loss_of(model, seqs: list[torch.Tensor]) -> torch.Tensor:
    """A next-token NLL over every position (fp32 logits), for gradient comparisons."""
    logits = model.compute_logits(model(ForwardBatch.for_training(seqs)))
    targets = torch.cat([s.roll(-1) for s in seqs])
    return -torch.log_softmax(logits, -1).gather(1, targets[:, None]).mean()


def hf_grads(model) -> dict[str, torch.Tensor]:
    """A ``MegatronCausalLM``'s parameter gradients as full HF-named tensors (gathered over TP)."""
    from zeromismatch.integrations.megatron.weights import REPLICATED_KINDS

    params = dict(model.gpt.named_parameters())
    out = {}
    for m in model.maps:
        if m.megatron not in params:
            continue  # a buffer (a sigmoid router's e_score_correction_bias): no gradient
        grad = params[m.megatron].grad
        per_rank = [grad] if m.kind in REPLICATED_KINDS else model._gather(grad)
        out.update(zip(m.hf, (t.clone() for t in m.to_hf(per_rank))))
    return out


def grad_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(max |a - b| over every tensor, max over tensors of that tensor's max |a - b| / max |a|)."""
    absolute = max(float((a[k] - b[k]).abs().max()) for k in a)
    relative = max(float((a[k] - b[k]).abs().max() / a[k].abs().max()) for k in a)
    return absolute, relative


@contextlib.contextmanager
def cpu_shims_for_stock_spec():
    """Megatron's stock local spec touches CUDA in three places on its way through a forward: RoPE
    frequencies moved to ``torch.cuda.current_device()``, the default causal mask built on "cuda",
    and the dropout RNG fork (a CUDA RNG state). The stock comparison passes its own mask and runs
    under these two patches; the kernel specs need none of them."""
    from megatron.core import tensor_parallel

    tracker = tensor_parallel.get_cuda_rng_tracker()
    saved_device, saved_fork = torch.cuda.current_device, tracker.fork
    torch.cuda.current_device = lambda: "cpu"
    tracker.fork = lambda *args, **kwargs: contextlib.nullcontext()
    try:
        yield
    finally:
        torch.cuda.current_device, tracker.fork = saved_device, saved_fork


def stock_padded_logits(model, seqs: list[torch.Tensor]) -> torch.Tensor:
    """``GPTModel.forward`` of a stock-spec model on equal-length sequences, with an explicit mask."""
    ids = torch.stack(seqs)
    length = ids.shape[1]
    mask = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)[None, None]
    with torch.no_grad(), cpu_shims_for_stock_spec():
        logits = model.gpt(ids, torch.arange(length).expand_as(ids), mask, runtime_gather_output=True)
    return logits.reshape(-1, logits.shape[-1])


def tp_worker(rank, group, preset: str, kernels: str, seqs: list[torch.Tensor]) -> dict:
    """One TP rank: fp32 logits (thd and sbhd), the same under the default set, HF state dict,
    gradients of ``loss_of``; bf16 thd logits; all gathered as full tensors (rank 0's are returned)."""
    from zeromismatch.integrations.megatron import build_megatron_model

    size = torch.distributed.get_world_size(group)
    model = build_megatron_model(preset, kernels, torch.float32, seed=0, tp_size=size)
    out = {"thd": packed_logits(model, seqs)}
    with torch.no_grad():
        out["sbhd"] = unpad(model.padded_logits(right_padded(seqs)), seqs)
    model.set_kernels("default")
    out["default_thd"] = packed_logits(model, seqs)
    model.set_kernels(kernels)
    out["state"] = model.state_dict_hf()
    loss_of(model, seqs).backward()
    out["grads"] = hf_grads(model)
    bf16 = build_megatron_model(preset, kernels, torch.bfloat16, seed=0, tp_size=size)
    out["bf16_thd"] = packed_logits(bf16, seqs)
    return out


def tp_worker_presets(rank, group, presets: list[str], kernels: str, seqs: list[torch.Tensor]) -> dict:
    """``tp_worker`` for each preset in turn, in one pair of spawned ranks."""
    return {preset: tp_worker(rank, group, preset, kernels, seqs) for preset in presets}


def tp_learner_steps(rank, group, config_dict: dict, rl_steps: int, start: dict | None = None) -> dict:
    """The RL learner on a Megatron model at the group's TP degree (1 in-process or 2 spawned):
    ``config.sft_steps`` supervised steps, then -- from ``start`` (HF tensors) if given, else from
    where SFT ended, with fresh RL optimizer state either way -- ``rl_steps`` on-policy RL steps, each
    on episodes the engine samples from the learner's current (gathered) weights. Returns the SFT
    losses, the RL start weights, each RL step's stats, the final weights, and one more step's k3 with
    the learner on the default set (the inverse: a kernel difference must show)."""
    from zeromismatch.integrations.megatron import from_causal_lm
    from zeromismatch.rl import RLConfig
    from zeromismatch.rl.learner import Learner, build_policy
    from zeromismatch.rl.loop import RolloutWorker, run_sft

    config = RLConfig.from_dict(config_dict)
    size = 1 if group is None else torch.distributed.get_world_size(group)
    project = RLConfig.from_dict({**config_dict, "trainer": "zeromismatch"})
    learner = Learner(config, model=from_causal_lm(build_policy(project, "learner"), tp_size=size))
    sft_losses = run_sft(config, learner)
    if start is not None:
        learner.model.load_state_dict_hf(start)
    start = learner.model.state_dict_hf()
    worker = RolloutWorker(config)
    steps = []
    for step in range(rl_steps):
        worker.set_weights(learner.model.state_dict_hf(), learner.version)
        episodes = worker.generate(step)
        stats = learner.rl_step(episodes, None)
        steps.append({**stats, "reward_mean": sum(ep.reward for ep in episodes) / len(episodes)})
    state = learner.model.state_dict_hf()
    worker.set_weights(state, learner.version)
    learner.model.set_kernels("default")
    inverse = learner.rl_step(worker.generate(rl_steps), None)["k3_kl"]
    return {"sft_losses": sft_losses, "start": start, "steps": steps, "state": state, "default_k3": inverse}
