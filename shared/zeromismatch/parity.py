"""The parity harness, the project's core claim as code: run a randomized workload through the
engine, recompute every sampled token's logprob with the trainer, and compare them (``run_parity``;
``zm parity`` is its command line, ``commands/parity.py``).

Workload (deterministic in ``--seed``): ``--num-prompts`` prompts of random length, half
of them sharing a random common prefix (so the prefix cache is exercised), each with its
own sampling seed; arrivals are staggered over engine steps (0-2 steps apart), so the
batch composition changes at almost every step, and prompts longer than
``--prefill-chunk`` are prefilled in chunks next to other requests' decodes. The engine
(``--tp`` workers; ``--engine vllm``: a real vLLM serving the project's models through the plugin)
generates up to ``--max-tokens`` tokens per prompt; then the trainer
(``--trainer-tp``; ``--trainer megatron``: a Megatron-core model on the same kernels) recomputes every
sampled token's logprob with its own packing: other
micro-batch sizes and the reverse order. Output: diff_max, diff_mean, diff_std, k3_kl
(``zeromismatch.metrics.mismatch.support_aware_diff_stats``: over the tokens both sides give a finite
logprob), tokens (those), informative_tokens (those whose logprob is not exactly 0 on both sides),
nonfinite_tokens (sampled tokens one side gives -inf: with unaligned kernels, top-k/top-p can exclude
on the trainer a token the engine sampled), identical (every token). Processed logprobs under greedy or
top_k 1 sampling are all 0 on any kernels, so that combination is refused; a run in which an engine step
failed compares nothing.
"""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16"}
RL_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # RLConfig's spelling


def make_workload(
    seed: int,
    num_prompts: int,
    vocab_size: int,
    max_prompt_len: int,
    params_kwargs: dict,
    prompts: list[list[int]] | None = None,
) -> list[tuple[int, list[int], object]]:
    """``[(arrival_step, prompt_token_ids, SamplingParams)]`` in arrival order. ``prompts`` (a trained
    policy's own task prompts) replace the random ones; the arrivals stay staggered."""
    from .engine import SamplingParams

    gen = torch.Generator().manual_seed(seed)
    max_prompt_len = max(2, max_prompt_len)
    prefix_len = int(torch.randint(1, max(2, max_prompt_len // 2), (1,), generator=gen))
    prefix = torch.randint(0, vocab_size, (prefix_len,), generator=gen).tolist()
    workload, arrival = [], 0
    for i in range(num_prompts):
        length = int(torch.randint(1, max_prompt_len + 1, (1,), generator=gen))
        prompt = torch.randint(0, vocab_size, (length,), generator=gen).tolist()
        if i % 2 == 1:
            prompt = (prefix + prompt)[:max_prompt_len]
        if prompts is not None:
            prompt = list(prompts[i % len(prompts)])
        params = SamplingParams(seed=seed * 100_003 + i, **params_kwargs)
        workload.append((arrival, prompt, params))
        arrival += int(torch.randint(0, 3, (1,), generator=gen))
    return workload


class EngineStepFailed(RuntimeError):
    """A workload request ended in an engine error: the run compares nothing."""


def run_engine_workload(llm, workload) -> list:
    """Feed ``workload`` through the step API with its staggered arrivals; outputs in order."""
    finished: dict[str, object] = {}
    pending = list(enumerate(workload))
    step = 0
    while pending or llm.has_unfinished():
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, params) = pending.pop(0)
            llm.add_request(prompt, params, request_id=str(index))
        for out in llm.step():
            if out.finished:
                finished[out.request_id] = out
        step += 1
    outputs = [finished[str(i)] for i in range(len(workload))]
    # a failed step ends its requests with the tokens sampled so far: comparing those truncated
    # outputs would print "identical" for a run that went wrong
    failed = [o for o in outputs if o.finish_reason == "error"]
    if failed:
        raise EngineStepFailed(
            f"{len(failed)} of {len(outputs)} requests ended in an engine error (first: request "
            f"{failed[0].request_id}: {failed[0].error}); nothing is compared"
        )
    return outputs


def build_trainer(preset, kernels, dtype, seed, quant, trainer="zeromismatch", tp_group=None):
    """The trainer side's model: the project's (``build_trainer_model``) or, with ``trainer="megatron"``,
    a Megatron-core model on the same kernels and seed's weights, at the TP degree of ``tp_group``."""
    from .engine.llm import build_trainer_model

    if trainer != "megatron":
        return build_trainer_model(preset, kernels, dtype, seed, quant, tp_group=tp_group)
    from .integrations.megatron import build_megatron_model

    tp_size = 1 if tp_group is None else torch.distributed.get_world_size(tp_group)
    return build_megatron_model(preset, kernels, dtype, seed, tp_size=tp_size, quant=quant)


def _trainer_worker(
    rank, group, preset, kernels, dtype, seed, quant, prompts, responses, params, mbs, order, trainer
):
    from .train.logprobs import compute_logprobs

    model = build_trainer(preset, kernels, dtype, seed, quant, trainer, tp_group=group)
    return compute_logprobs(model, prompts, responses, params, micro_batch_size=mbs, order=order)


def trainer_logprobs(
    preset, kernels, dtype, seed, quant, trainer_tp, outputs, model=None, trainer="zeromismatch"
) -> list[torch.Tensor]:
    """The trainer's recompute: packing independent of the engine (reverse order, ~thirds). ``model``:
    an already built trainer model (TP 1), else one is built from the preset in each worker."""
    from .engine.tp import run_spmd
    from .train.logprobs import compute_logprobs

    prompts = [o.prompt_token_ids for o in outputs]
    responses = [o.token_ids for o in outputs]
    params = [o.sampling_params for o in outputs]
    mbs = max(1, (len(outputs) + 2) // 3)
    order = list(range(len(outputs)))[::-1]
    if model is not None:
        return compute_logprobs(model, prompts, responses, params, micro_batch_size=mbs, order=order)
    args = (preset, kernels, dtype, seed, quant, prompts, responses, params, mbs, order, trainer)
    if trainer_tp == 1:
        return _trainer_worker(0, None, *args)
    return run_spmd(_trainer_worker, trainer_tp, *args)


def diff_stats(rollout: torch.Tensor, trainer: torch.Tensor) -> dict:
    """Support-aware: with unaligned kernels under top-k/top-p the engine can sample a token the
    trainer's processed distribution excludes (-inf there): reported (identical False,
    ``nonfinite_tokens``), not refused as bad input as it was until session 15. A nan or +inf
    logprob is no such case but a broken side: still one clear error."""
    from .metrics.mismatch import support_aware_diff_stats

    for values, name in ((rollout, "the engine's"), (trainer, "the trainer's")):
        broken = torch.isnan(values) | (values == float("inf"))
        if bool(broken.any()):
            raise ValueError(f"{name} logprobs hold {int(broken.sum())} nan or +inf value(s)")
    stats = support_aware_diff_stats(rollout, trainer)
    # tokens whose logprob carries information, among the compared (finite) ones: a tiny top_p makes
    # many processed logprobs exactly 0 on both sides, and those agree whatever the kernels
    finite = torch.isfinite(rollout) & torch.isfinite(trainer)
    stats["informative_tokens"] = int((finite & ((rollout != 0) | (trainer != 0))).sum())
    return stats


def run_parity(
    model: str | None,
    kernels: str = "aligned",
    seed: int = 0,
    num_prompts: int = 8,
    max_tokens: int = 16,
    tp: int = 1,
    trainer_tp: int = 1,
    prefill_chunk: int | None = 8,
    max_num_seqs: int = 4,
    quant: str = "none",
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    dtype: str = "fp32",
    logprobs_mode: str = "processed",
    max_num_batched_tokens: int = 32,
    max_prompt_len: int = 40,
    rollout_kernels: str | None = None,
    rollout_dtype: str | None = None,
    rollout_quant: str | None = None,
    kv_cache_dtype: str = "auto",
    rollout_lm_head: str = "fp32",
    checkpoint: str | None = None,
    trainer: str = "zeromismatch",
    engine: str = "zeromismatch",
) -> dict:
    """Engine (rollout numerics) vs trainer (learner numerics) on one workload; see the module
    docstring. ``dtype`` / ``quant`` / ``kernels`` are both sides' unless a ``rollout_*`` field overrides
    the engine's. The engine always holds the trainer's weights cast to its dtype and re-quantized to its
    format, as an RL weight update delivers them. ``checkpoint``: a ``zm train`` run directory (or one of
    its ``checkpoints/step_N`` directories) whose trained weights and task prompts are used instead of
    the preset's random init and random tokens. ``trainer="megatron"``: the trainer side is a Megatron-core
    model on the same kernels and weights (``integrations.megatron``), at ``trainer_tp``.
    ``engine="vllm"``: the rollout side is a real vLLM serving the plugin (``integrations.vllm``), fed
    the same workload through its step API (TP 1, the aligned stack's engine numerics)."""
    if logprobs_mode == "processed" and (temperature == 0 or top_k == 1):
        # the processed distribution is then one-hot: every logprob is exactly 0 on any kernels, and
        # "identical" would only say that both sides picked the same tokens
        raise ValueError(
            "processed logprobs are all exactly 0 under greedy (temperature 0) or top_k 1 sampling, so "
            "the comparison would pass for any kernels; pass --logprobs-mode raw"
        )
    from .engine import LLM
    from .engine.llm import build_preset
    from .models import quantize_model, resolve_config
    from .models.causal_lm import check_tp_degree
    from .models.memory import check_weights_fit
    from .rl.stacks import numerics_problems

    dtype = DTYPE_ALIASES.get(dtype, dtype)
    rollout_dtype = DTYPE_ALIASES.get(rollout_dtype, rollout_dtype)
    for name, value in (("--dtype", dtype), ("--rollout-dtype", rollout_dtype)):
        if value is not None and value not in DTYPES:
            raise ValueError(f"{name} must be one of {sorted(DTYPES)}, got {value!r}")
    sizes = (("--num-prompts", num_prompts), ("--max-tokens", max_tokens), ("--max-num-seqs", max_num_seqs),
             ("--max-num-batched-tokens", max_num_batched_tokens))  # fmt: skip
    for flag, value in sizes:
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    numerics = dict(
        kernels=kernels, rollout_kernels=rollout_kernels, dtype=RL_DTYPES[dtype], quant=quant,
        rollout_dtype=RL_DTYPES.get(rollout_dtype), rollout_quant=rollout_quant,
        kv_cache_dtype=kv_cache_dtype, rollout_lm_head=rollout_lm_head,
    )  # fmt: skip
    for field, why in numerics_problems(numerics):
        raise ValueError(f"--{field.replace('_', '-')}: {why} (got {numerics[field]!r})")
    engine_kernels = rollout_kernels or kernels
    engine_dtype = rollout_dtype or dtype
    engine_quant = rollout_quant or quant
    trained = None
    if checkpoint is not None:
        from .rl.trained import load_trained_policy

        trained = load_trained_policy(checkpoint)
        if model is not None and model != trained.config.model:
            raise ValueError(f"--model {model}: the checkpoint holds a {trained.config.model} policy")
        model = trained.config.model
        if tp > 1 or trainer_tp > 1:
            raise ValueError(f"--checkpoint runs at TP 1; got --tp {tp} --trainer-tp {trainer_tp}")
    elif model is None:
        raise ValueError("--model is required (or --checkpoint RUN_DIR)")
    _check_engine(engine, model, tp, numerics)
    config = resolve_config(model)
    check_tp_degree(config, tp, "--tp")
    check_tp_degree(config, trainer_tp, "--trainer-tp")
    _check_trainer(trainer, config, trainer_tp)
    if engine_quant != "none" and (tp > 1 or trainer_tp > 1):
        # refused here, before the rollout runs: each TP worker would fail on its own otherwise
        raise ValueError(
            f"--quant {engine_quant} runs at TP 1 only (quantize_model does not shard quantized weights); "
            f"got --tp {tp} --trainer-tp {trainer_tp}"
        )
    # the engine's copy stays alive while the trainer holds its own
    check_weights_fit(config, DTYPES[dtype], copies=2, what=f"--model {model}")
    params_kwargs = dict(
        temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens, logprobs_mode=logprobs_mode
    )
    engine_kwargs = dict(
        dtype=DTYPES[engine_dtype], seed=seed, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, prefill_chunk=prefill_chunk, block_size=8,
        kv_cache_dtype=kv_cache_dtype, lm_head_precision=rollout_lm_head,
    )  # fmt: skip
    trainer_model, prompts = None, None
    if trained is not None:
        project = {**numerics, "trainer": "zeromismatch"}  # (a Megatron trainer is made from it below)
        trainer_model, engine_model = trained.build(project, "learner"), trained.build(project, "rollout")
        prompts = trained.prompts(num_prompts)
        config = trainer_model.config
        params_kwargs["stop_token_ids"] = trained.stop_token_ids
        if trainer == "megatron":
            from .integrations.megatron import from_causal_lm

            trainer_model = from_causal_lm(trainer_model)
    elif trainer_tp == 1:
        trainer_model = build_trainer(model, kernels, DTYPES[dtype], seed, quant, trainer)
    if tp == 1:
        if trained is None:
            engine_model = build_preset(model, engine_kernels, DTYPES[engine_dtype], seed, None)
        if trainer_model is not None:  # the trainer's weights, cast and re-quantized as an update would
            engine_model.load_state_dict_hf(trainer_model.state_dict_hf())
        if engine_quant != "none":
            quantize_model(engine_model, engine_quant)
        if engine == "vllm":
            from .integrations.vllm.engine import VllmEngine

            llm = VllmEngine(
                engine_model, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                max_prefill_chunk=prefill_chunk, block_size=engine_kwargs["block_size"],
                logprobs_mode=logprobs_mode, seed=seed, kernels=engine_kernels,
            )  # fmt: skip
        else:
            llm = LLM(engine_model, engine_kernels, **engine_kwargs)
    else:
        llm = LLM(model, engine_kernels, quant=None if engine_quant == "none" else engine_quant, tp=tp,
                  **engine_kwargs)  # fmt: skip
    try:
        vocab = int(config.vocab_size)
        workload = make_workload(seed, num_prompts, vocab, max_prompt_len, params_kwargs, prompts)
        outputs = run_engine_workload(llm, workload)
        stats = {
            "prefix_cache_hits": int(llm.prefix_cache_hits()),
            "num_cached_prompt_tokens": sum(o.num_cached_tokens for o in outputs),
        }
    finally:
        if tp > 1:
            llm.close()
        elif engine == "vllm":
            llm.shutdown()
    del llm
    recomputed = trainer_logprobs(
        model, kernels, DTYPES[dtype], seed, quant, trainer_tp, outputs, trainer_model, trainer
    )
    rollout = torch.cat([torch.tensor(o.logprobs, dtype=torch.float32) for o in outputs])
    result = diff_stats(rollout, torch.cat(recomputed))
    result.update(stats)
    result.update(
        model=model, kernels=kernels, engine=engine, seed=seed, num_prompts=num_prompts,
        max_tokens=max_tokens, tp=tp,
        trainer=trainer, trainer_tp=trainer_tp, prefill_chunk=prefill_chunk, max_num_seqs=max_num_seqs,
        quant=quant,
        dtype=dtype, temperature=temperature, top_k=top_k, top_p=top_p, logprobs_mode=logprobs_mode,
        rollout_kernels=engine_kernels, rollout_dtype=engine_dtype, rollout_quant=engine_quant,
        kv_cache_dtype=kv_cache_dtype, rollout_lm_head=rollout_lm_head,
        checkpoint=None if trained is None else str(trained.path),
        weights_sha256=None if trained is None else trained.weights_sha256,
    )  # fmt: skip
    return result


def _check_engine(engine: str, model: str, tp: int, numerics: dict) -> None:
    """``--engine`` and what the vLLM engine can serve, refused before anything runs."""
    from .rl.config import ROLLOUT_ENGINES

    if engine not in ROLLOUT_ENGINES:
        raise ValueError(f"--engine must be one of {ROLLOUT_ENGINES}, got {engine!r}")
    if engine != "vllm":
        return
    from .integrations.vllm import serving_problems

    if tp != 1:
        raise ValueError(f"--tp {tp}: the vLLM plugin runs at tensor-parallel size 1 (--engine vllm)")
    side = {
        "rollout_kernels": numerics["rollout_kernels"] or numerics["kernels"],
        "rollout_quant": numerics["rollout_quant"] or numerics["quant"],
    }
    problems = serving_problems(model, side["rollout_kernels"], side["rollout_quant"],
                                numerics["kv_cache_dtype"], numerics["rollout_lm_head"])  # fmt: skip
    for field, why in problems:
        value = model if field == "model" else side.get(field, numerics.get(field))
        raise ValueError(f"--{field.replace('_', '-')} {value}: {why} (--engine vllm)")


def _check_trainer(trainer: str, config, trainer_tp: int) -> None:
    """``--trainer`` and what it can run, refused before the rollout (one ValueError each)."""
    from .rl.config import TRAINERS

    if trainer not in TRAINERS:
        raise ValueError(f"--trainer must be one of {TRAINERS}, got {trainer!r}")
    if trainer != "megatron":
        return
    from .integrations.megatron import check_megatron_model

    check_megatron_model(config, trainer_tp)
