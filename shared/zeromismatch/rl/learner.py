"""The learner: trainer-side model, optimizer, SFT warm start and one RL update.

An RL update recomputes the logprobs of every model-written token with the trainer
path (``train.logprobs.compute_logprobs``: packed full sequences, micro-batches of its
own choosing), under the *current* learner weights and with autograd. The loss (one
of ``train.losses``) divides by the rollout engine's recorded logprobs for the
importance weights. For the mismatch metrics it also recomputes, without gradient,
the logprobs under the weights that generated the batch (the "rollout version"):
``trainer(rollout version) − rollout`` is the kernel mismatch (exactly zero with an
aligned stack), ``trainer(now) − trainer(rollout version)`` the weight lag.

``RLConfig.trainer`` picks the learner's model: the project's ``CausalLM`` or, with "megatron", a
Megatron-core ``GPTModel`` on the same kernels (``integrations.megatron.MegatronCausalLM``, which
offers the same trainer interface). Either way the optimizer is torch's AdamW over
``model.parameters()``, not Megatron's (Distributed)Optimizer: that one needs Megatron's DDP
wrapper (contiguous ``main_grad`` buffers, data-parallel groups) and keeps its own state layout,
while this learner has no data parallelism to shard over and its checkpoints, resume and weights
hash are the torch optimizer's ``state_dict`` and the HF tensors. AdamW's update is elementwise, so
on TP shards it is the update Megatron's non-distributed optimizer makes. A Megatron model at TP > 1
(``from_causal_lm(model, tp_size=2)`` in each rank of a gloo group) trains through the same
``Learner``: its gradient norm and clipping span the TP group (``MegatronCausalLM.clip_grad_norm_``).
"""

from __future__ import annotations

import copy
import math

import torch

from ..engine import SamplingParams
from ..metrics import mismatch
from ..train.logprobs import compute_logprobs
from ..train.losses import PolicyBatch, compute_loss, group_normalized_advantages
from .config import RLConfig
from .rollout import Episode

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_policy(config: RLConfig, side: str = "learner"):
    """The run's model on one side (``"learner"`` | ``"rollout"``): the preset with the shared
    tokenizer's vocabulary (+ overrides), in that side's dtype and weight format. Both sides start
    from the same seed's weights. The learner keeps its weights as trainable masters and, with a
    format, fake-quantizes them in its forward (the engine's quantize -> dequantize, straight-through
    gradient); the engine holds the quantized weights and re-quantizes at every weight update."""
    from ..envs import default_tokenizer
    from ..models import build_model, fake_quantize_model, preset_dict, quantize_model

    if side not in ("learner", "rollout"):
        raise ValueError(f"side must be 'learner' or 'rollout', got {side!r}")
    hf = preset_dict(config.model)
    hf["vocab_size"] = default_tokenizer().vocab_size
    hf.update(config.model_overrides)
    learner = side == "learner"
    kernels = config.kernels if learner else config.engine_kernels
    dtype = config.dtype if learner else config.engine_dtype
    model = build_model(hf, kernels=kernels, dtype=DTYPES[dtype], seed=config.seed)
    fmt = config.quant if learner else config.engine_quant
    if fmt != "none":
        (fake_quantize_model if learner else quantize_model)(model, fmt)
    if learner and config.trainer == "megatron":
        # the same weights in a Megatron-core GPTModel on the same kernels (megatron-core is imported
        # here only: the core package does not depend on the integration)
        from ..integrations.megatron import from_causal_lm

        return from_causal_lm(model)
    return model


def sampling_params(config: RLConfig) -> SamplingParams:
    return SamplingParams(
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        max_tokens=config.max_new_tokens,
        logprobs_mode=config.logprobs_mode,
    )


def state_snapshot(model) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict_hf().items()}


def weights_hash(model) -> str:
    return state_dict_sha256(model.state_dict_hf())


def state_dict_sha256(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every (name, bytes) of an HF state dict, in name order."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# keys every RL step record carries (NaN when the step has no token to compute them on), so a run's
# summary never meets a step without them
_ALWAYS_REPORTED = (
    "diff_max", "diff_mean", "diff_std", "k3_kl", "is_mean", "is_max", "is_min", "is_median",
    "peak_over_median", "log_ratio_abs_max",
)  # fmt: skip


class Learner:
    def __init__(self, config: RLConfig, model=None):
        self.config = config
        self.model = model if model is not None else build_policy(config, "learner")
        self.version = 0
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, weight_decay=0.0)
        # The warm start has an optimizer of its own, so RL starts from fresh Adam moments: with one
        # shared optimizer the warm start's moments kept moving the weights along the supervised
        # direction at the RL learning rate (an RL step with an all-zero gradient changed them), and
        # that motion showed up as weight lag.
        self._sft_optimizer: torch.optim.Optimizer | None = None
        # the shadow model evaluates the rollout version's weights for the mismatch decomposition
        self._shadow = None

    # ---- supervised warm start ------------------------------------------------------------------
    def sft_step(self, data: list[tuple[list[int], list[int], list[bool]]], lr: float) -> float:
        if self._sft_optimizer is None:
            self._sft_optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        for group in self._sft_optimizer.param_groups:
            group["lr"] = lr
        prompts, responses, masks = zip(*data)
        logprobs = compute_logprobs(
            self.model, prompts, responses, logprobs_mode="raw",
            micro_batch_size=self.config.micro_batch_size, requires_grad=True,
        )  # fmt: skip
        per_seq = [-(lp[torch.tensor(m)]).mean() for lp, m in zip(logprobs, masks)]
        loss = torch.stack(per_seq).mean()
        self._sft_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self._clip()
        self._sft_optimizer.step()
        return float(loss.detach())

    # ---- one RL update --------------------------------------------------------------------------
    def _recompute(self, model, episodes: list[Episode], requires_grad: bool) -> list[torch.Tensor]:
        # The objective needs the distribution the sampler drew from: the learner always
        # evaluates *processed* logprobs, whatever the engine was told to report (S2 fix 1).
        params = sampling_params(self.config)
        return compute_logprobs(
            model,
            [ep.prompt_ids for ep in episodes],
            [ep.response_ids for ep in episodes],
            [params] * len(episodes),
            logprobs_mode="processed",
            micro_batch_size=self.config.micro_batch_size,
            requires_grad=requires_grad,
        )

    def _at_version(self, snapshot: dict[str, torch.Tensor] | None, episodes: list[Episode]):
        if snapshot is None:
            return None
        if self._shadow is None:
            self._shadow = copy.deepcopy(self.model)
        self._shadow.load_state_dict_hf(snapshot)
        with torch.no_grad():
            return self._recompute(self._shadow, episodes, requires_grad=False)

    def _clip(self) -> float:
        if getattr(self.model, "tp_size", 1) > 1:
            # a TP-sharded learner's norm spans its TP group, counting each replicated tensor once
            return self.model.clip_grad_norm_(self.config.grad_clip)
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = mismatch.pre_clip_grad_norm(params)
        if self.config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip)
        return norm

    def rl_step(self, episodes: list[Episode], rollout_snapshot: dict[str, torch.Tensor] | None) -> dict:
        """One optimizer step on ``episodes``. ``rollout_snapshot`` holds the weights that generated
        them when they differ from the learner's current weights (lag > 0), else None."""
        episodes = [ep for ep in episodes if ep.num_model_tokens > 0]
        if not episodes:
            raise RuntimeError("no episode in the batch has a model-written token")
        learner_now = self._recompute(self.model, episodes, requires_grad=True)
        unaudited = rollout_snapshot is not None and not self.config.audit_rollout_version
        learner_then = None if unaudited else self._at_version(rollout_snapshot, episodes)
        if learner_then is None:
            learner_then = [lp.detach() for lp in learner_now]

        length = max(len(ep.response_ids) for ep in episodes)
        batch = len(episodes)
        learner_rows = []
        rollout = torch.zeros(batch, length)
        then = torch.zeros(batch, length)
        mask = torch.zeros(batch, length, dtype=torch.bool)
        versions = torch.full((batch, length), -1, dtype=torch.int64)
        for i, ep in enumerate(episodes):
            n = len(ep.response_ids)
            m = torch.tensor(ep.model_mask)
            learner_rows.append(torch.cat([learner_now[i], learner_now[i].new_zeros(length - n)]))
            rollout[i, :n] = torch.tensor([0.0 if math.isnan(x) else x for x in ep.rollout_logprobs])
            then[i, :n] = learner_then[i].detach()
            mask[i, :n] = m
            versions[i, :n] = torch.tensor(ep.versions)
        learner = torch.stack(learner_rows).float()
        # A sampled token can have probability 0 under the current policy's top-k/top-p support:
        # routinely at lag > 0 (the support moved since the rollout version), and also when the two
        # sides' logits differ (unaligned kernels). Its processed logprob is -inf. Its importance
        # weight is then exactly 0: it adds nothing to the loss, but it still counts in |y_i|, and
        # its response still counts in B and in its group's baseline (``PolicyBatch.support``).
        now_finite = torch.isfinite(learner.detach())
        then_finite = torch.isfinite(then)
        # Two different events: the trainer at the rollout's own version giving a sampled token
        # probability 0 is kernel mismatch (an infinite diff, reported as such below); the current
        # version doing so, while the rollout version did not, is weight lag.
        kernel_out_of_support = int((mask & ~then_finite).sum())
        lag_out_of_support = int((mask & then_finite & ~now_finite).sum())
        learner = torch.where(now_finite, learner, torch.zeros_like(learner))
        then = torch.where(then_finite, then, torch.zeros_like(then))
        rewards = torch.tensor([ep.reward for ep in episodes])
        group_ids = torch.tensor([ep.group_id for ep in episodes])
        # PPO has no built-in baseline: it gets the group-normalised advantage GRPO uses
        advantages = None
        if self.config.algo == "ppo_clip":
            advantages = group_normalized_advantages(rewards, group_ids)
        policy = PolicyBatch(
            learner_logprobs=learner,
            rollout_logprobs=rollout,
            mask=mask,
            rewards=rewards,
            group_ids=group_ids,
            advantages=advantages,
            support=now_finite,
        )
        out = compute_loss(self.config.algo, policy, **self.config.algo_options)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = self._clip()
        self.optimizer.step()
        self.version += 1

        # the kernel term compares the engine with the trainer at the same (rollout) version; the
        # IS weights and the gap decomposition also need the current policy's logprob to be finite
        kernel_tokens = mask & then_finite
        both = kernel_tokens & now_finite
        stats = dict.fromkeys(_ALWAYS_REPORTED, math.nan)  # a step with no such tokens still has the keys
        if bool(kernel_tokens.any()):
            kernel = mismatch.logprob_diff_stats(rollout[kernel_tokens], then[kernel_tokens])
            stats.update({f"kernel_{k}": v for k, v in kernel.items()})
            stats.update({k: kernel[k] for k in ("diff_max", "diff_mean", "diff_std", "k3_kl")})
        if bool(both.any()):
            stats.update(mismatch.is_weight_stats(learner.detach()[both], rollout[both]))
            gap = mismatch.decompose_logprob_gap(learner.detach()[both], then[both], rollout[both])
            stats.update({f"gap_{k}": v for k, v in gap.stats().items()})
        if kernel_out_of_support:
            # The engine sampled a token the trainer, at the same weights, gives probability 0: its
            # diff is infinite (dropping it used to report such a step as an exact zero).
            infinite = {"diff_max": math.inf, "diff_mean": math.inf, "diff_std": math.nan, "k3_kl": math.inf}
            stats.update(infinite)
            stats.update({f"kernel_{k}": v for k, v in infinite.items()}, kernel_identical=False)
            # the decomposition's kernel term too: it is computed on finite tokens only, and a zero
            # there must not read as "no kernel mismatch" (S3's kernel-term claim reads it)
            stats.update(gap_kernel_abs_max=math.inf, gap_kernel_abs_mean=math.inf, gap_kernel_mean=-math.inf)
            stats["gap_kernel_share"] = math.nan  # a share of an infinite term
        lag = mismatch.lag_stats(versions[mask], self.version - 1)
        stats.update({k: v for k, v in lag.items() if k.startswith("lag_")})
        stats.update({f"loss_{k}": v for k, v in out.stats.items()})
        stats["loss"] = float(out.loss.detach())
        # Monte-Carlo entropy of the sampling distribution: -E[log p] over the sampled tokens,
        # with the trainer's processed logprobs at the rollout version (engine-independent).
        entropy_tokens = then[kernel_tokens].double()
        stats["entropy"] = float(-entropy_tokens.mean()) if entropy_tokens.numel() else math.nan
        if unaudited:
            # "then" is the current learner here, not the rollout's version: these would mix weight
            # lag into the kernel term, so they are not reported
            unreported = ("kernel_", "diff_", "gap_", "k3_kl", "entropy")
            stats.update({key: float("nan") for key in stats if key.startswith(unreported)})
        stats["grad_norm_preclip"] = grad_norm
        stats["out_of_support_tokens"] = kernel_out_of_support + lag_out_of_support
        stats["kernel_out_of_support_tokens"] = kernel_out_of_support
        stats["lag_out_of_support_tokens"] = lag_out_of_support
        if unaudited:
            # "then" was the current learner: the causes cannot be told apart
            stats["kernel_out_of_support_tokens"] = stats["lag_out_of_support_tokens"] = math.nan
        stats["tokens"] = int(mask.sum())
        return stats
