"""The typed configuration of one RL run, validated once.

Experiments build these through named functions (``experiments/<name>/configs.py``);
``zm train`` builds one from flags. ``to_dict``/``from_dict`` round-trip through JSON so a
run directory's ``config.json`` is enough to rerun or resume it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from typing import Any

from ..engine.runner import LM_HEAD_PRECISIONS
from ..engine.sampling_params import SamplingParams
from ..train.losses import LOSSES

ALGOS = ("reinforce_zero", "grpo", "gspo", "ppo_clip", "tis")
EXECUTORS = ("inprocess", "ray")
UPDATE_MODES = ("keep", "wait", "abort")
DTYPES = ("float32", "bfloat16")
QUANTS = ("none", "fp8", "nvfp4")
MAX_LAG = 64


@dataclass
class RLConfig:
    env: str = "arithmetic"
    model: str = "tiny-qwen3"
    algo: str = "reinforce_zero"
    kernels: str = "aligned"  # the learner's kernel set
    rollout_kernels: str | None = None  # the engine's; None = same as the learner (aligned stack)
    dtype: str = "float32"
    quant: str = "none"
    lag: int = 0  # maximum policy lag k: batch b is generated with weights version max(0, b - k)
    steps: int = 20
    prompts_per_step: int = 8
    group_size: int = 4
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    logprobs_mode: str = "processed"
    lr: float = 2e-3
    grad_clip: float = 1.0  # 0 disables clipping; the pre-clip norm is always logged
    seed: int = 0
    sft_steps: int = 0  # supervised warm start on env demonstrations before RL
    sft_batch: int = 16
    sft_lr: float = 3e-3
    eval_every: int = 0  # 0: evaluate only before and after RL
    eval_size: int = 32
    # samples per eval prompt at the training temperature/top-k/top-p for sampled pass@1 (0: greedy only)
    eval_samples: int = 4
    checkpoint_every: int = 0  # 0: no checkpoints
    executor: str = "inprocess"
    update_mode: str = "keep"
    micro_batch_size: int = 16
    # at lag > 0 the learner re-scores each batch with the weights that generated it (one extra
    # no-grad forward) to measure the kernel mismatch apart from weight lag; False skips that audit
    # (kernel-mismatch and gap metrics are then NaN at lag > 0) -- for throughput measurements only
    audit_rollout_version: bool = True
    enable_prefix_caching: bool = True  # on where the policy supports it (not hybrid Mamba2 models)
    prefix_cache_versioned: bool = True  # False reproduces the stale-prefix bug of S2 fix 2
    lm_head_precision: str = "fp32"
    step_latency_s: float = 0.0  # desktop env: injected latency per env step
    env_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"max_digits": 1} for arithmetic
    wandb: bool = False
    model_overrides: dict[str, Any] = field(default_factory=dict)
    algo_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        from ..envs import ENVS

        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"RLConfig.{name}: {why} (got {getattr(self, name)!r})")

        if self.env not in ENVS:
            raise bad("env", f"must be one of {sorted(ENVS)}")
        if self.algo not in ALGOS:
            raise bad("algo", f"must be one of {ALGOS}")
        if self.executor not in EXECUTORS:
            raise bad("executor", f"must be one of {EXECUTORS}")
        if self.update_mode not in UPDATE_MODES:
            raise bad("update_mode", f"must be one of {UPDATE_MODES}")
        if self.dtype not in DTYPES:
            raise bad("dtype", f"must be one of {DTYPES}")
        if self.quant not in QUANTS:
            raise bad("quant", f"must be one of {QUANTS}")
        def is_int(value) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def is_number(value) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        if not is_int(self.lag) or not 0 <= self.lag <= MAX_LAG:
            raise bad("lag", f"must be an int in [0, {MAX_LAG}]")
        positive = (
            "steps", "prompts_per_step", "group_size", "max_new_tokens", "eval_size", "micro_batch_size",
        )  # fmt: skip
        for name in positive:
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise bad(name, "must be a positive int")
        for name in ("sft_steps", "sft_batch", "eval_every", "checkpoint_every", "eval_samples"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, "must be a non-negative int")
        # every algorithm here takes a group baseline (ppo_clip gets GRPO's group-normalised advantage):
        # with one response per prompt every advantage is 0 and nothing is learned
        if self.group_size < 2:
            raise bad("group_size", "group baselines need at least 2 responses per prompt")
        for name in ("lr", "sft_lr"):
            if not is_number(getattr(self, name)) or getattr(self, name) <= 0:
                raise bad(name, "must be a finite number > 0")
        for name in ("grad_clip", "step_latency_s"):
            if not is_number(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, "must be a finite number >= 0")
        for name in ("audit_rollout_version", "enable_prefix_caching", "prefix_cache_versioned", "wandb"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be a bool")
        if self.executor == "ray":
            # the Ray executor has neither: accepting them would silently drop checkpoints or logs
            for name in ("checkpoint_every", "wandb"):
                if getattr(self, name):
                    raise bad(name, "the Ray executor neither checkpoints nor logs to wandb; "
                                    "use executor='inprocess' or leave it off")  # fmt: skip
        self._validate_sampling()
        if self.lm_head_precision not in LM_HEAD_PRECISIONS:
            raise bad("lm_head_precision", f"must be one of {LM_HEAD_PRECISIONS}")
        accepted = set(inspect.signature(LOSSES[self.algo]).parameters) - {"batch"}
        unknown = sorted(set(self.algo_options) - accepted)
        if unknown:
            raise bad("algo_options", f"{self.algo} takes only {sorted(accepted)}, not {unknown}")

    def _validate_sampling(self) -> None:
        """The rollout's sampling settings, checked now (not after the warm start) by the engine's
        own rules; RL needs temperature > 0 (greedy groups have identical responses, and no
        gradient: every sampled token has logprob 0)."""
        try:
            params = SamplingParams(
                temperature=self.temperature,
                top_k=self.top_k,
                top_p=self.top_p,
                max_tokens=self.max_new_tokens,
                logprobs_mode=self.logprobs_mode,
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"RLConfig: {err}") from None
        if params.greedy:
            raise ValueError(
                f"RLConfig.temperature: RL samples at temperature > 0 (got {self.temperature!r})"
            )

    @property
    def engine_kernels(self) -> str:
        return self.rollout_kernels or self.kernels

    def weight_version_for_batch(self, batch_index: int) -> int:
        """The lag schedule: which learner version generates batch ``batch_index``."""
        return max(0, batch_index - self.lag)

    def evaluates_after_step(self, step: int) -> bool:
        """The mid-run eval schedule: after every ``eval_every``-th update, except the last (the
        final evaluation follows it anyway)."""
        return bool(self.eval_every) and (step + 1) % self.eval_every == 0 and step + 1 < self.steps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RLConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"RLConfig: unknown field(s) {unknown}")
        return cls(**data)

    def replace(self, **changes: Any) -> RLConfig:
        return dataclasses.replace(self, **changes)
