"""Tensor parallelism over ``torch.distributed`` (gloo on CPU, NCCL on GPU).

Megatron-style split: column-parallel linears (q/k/v, MLA q_b/kv_b, gate/up) keep a
contiguous slice of the *output* features on each rank, which for attention means a
contiguous range of heads; row-parallel linears (o_proj, down_proj) keep the matching
slice of the *input* features and reduce through ``kernels.row_parallel_linear``, which in
the aligned set sums a fixed number of virtual shards in one fixed tree, so TP 1 and TP 2
give the same bits.

Kept replicated on every rank (computed redundantly, never reduced): embeddings, lm_head,
norms, MoE routers and routed experts (the ``moe_experts`` contract has no TP split), the
DeepSeek q_a / kv_a down-projections, and whole Mamba2 mixers (splitting the conv/SSM
channels by group is possible but not needed at this scale). Replicated compute is
identical on every rank, so it cannot break TP-degree invariance.

Scope: TP > 1 is for forward passes (rollout, logprob recompute) under ``torch.no_grad``.
Gradients do not flow through the collectives (plain ``torch.distributed`` calls are not
differentiable), so training at TP > 1 needs a Megatron-style autograd-aware reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorParallel:
    group: object | None = None
    rank: int = 0
    world_size: int = 1

    @classmethod
    def from_group(cls, group) -> TensorParallel:
        if group is None:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ValueError("tp_group was given but torch.distributed is not initialized")
        return cls(group=group, rank=dist.get_rank(group), world_size=dist.get_world_size(group))

    @property
    def reduce_group(self):
        """The group to hand to ``row_parallel_linear`` (None means TP degree 1)."""
        return self.group if self.world_size > 1 else None

    def local_size(self, full: int, what: str) -> int:
        if full % self.world_size:
            raise ValueError(
                f"{what}={full} is not divisible by the tensor-parallel degree {self.world_size}"
            )
        return full // self.world_size

    def shard(self, full: torch.Tensor, dim: int, name: str) -> torch.Tensor:
        """This rank's contiguous slice of ``full`` along ``dim``."""
        size = self.local_size(full.shape[dim], f"{name} dim {dim}")
        return full.narrow(dim, self.rank * size, size)

    def gather(self, local: torch.Tensor, dim: int) -> torch.Tensor:
        """Concatenate every rank's slice along ``dim`` (inverse of ``shard``)."""
        if self.world_size == 1:
            return local
        import torch.distributed as dist

        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)
