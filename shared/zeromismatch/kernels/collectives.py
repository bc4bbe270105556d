"""Layout-invariant reductions for tensor parallelism: virtual shards and one fixed tree.

A row-parallel linear splits the input dim K across d ranks; each rank multiplies its
slice and the partial outputs are summed. With a plain all_reduce the summation order,
and the K-slice each partial GEMM covers, depend on d, so TP 1, 2 and 4 give different
bits. Here K is always cut into V ("virtual shards") equal pieces, whatever d is
(d must divide V). Each piece's partial product is computed separately, with the same
GEMM shape ``[M, K/V] x [K/V, N]`` at every d; rank r owns pieces ``r*V/d .. (r+1)*V/d-1``.
The V partials (upcast to fp32) are gathered in piece order and summed in one fixed
pairwise tree, ``tree_sum``; at d=1 the same tree runs locally. So the result depends on
V, never on d. The all-reduce is therefore an all_gather plus local arithmetic; it moves
V/d times more data than a ring all_reduce of one partial, the price of layout invariance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist


def tree_sum(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum in a fixed pairwise tree: ((p0+p1)+(p2+p3))+...; an odd last element carries up."""
    if len(partials) == 0:
        raise ValueError("tree_sum needs at least one partial")
    level = list(partials)
    while len(level) > 1:
        nxt = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2 == 1:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def tree_sum_fp32_(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """``tree_sum([p.float() for p in partials])``, bit for bit, with fewer buffers: each pair's
    left operand becomes fp32 (a copy unless it already is fp32, in which case it is
    *overwritten*) and the right one is added into it in place (``fp32 += bf16`` upcasts
    exactly, then rounds the one fp32 add, as ``a.float() + b.float()`` does). Large fresh
    buffers cost page faults on this machine (~1 ms per 2 MiB), so the in-place form is much
    faster. Not for autograd inputs."""
    if len(partials) == 0:
        raise ValueError("tree_sum needs at least one partial")
    level = [p.float() for p in partials[::2]]
    level = [
        level[i // 2].add_(partials[i + 1]) if i + 1 < len(partials) else level[i // 2]
        for i in range(0, len(partials), 2)
    ]
    while len(level) > 1:
        nxt = [level[i].add_(level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2 == 1:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def world_size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def rank_in(group) -> int:
    return 0 if group is None else dist.get_rank(group)


def check_virtual_shards(k_local: int, degree: int, virtual_shards: int) -> int:
    """Return the number of pieces this rank owns; one clear error if the split is impossible."""
    if virtual_shards <= 0:
        raise ValueError(f"virtual_shards must be positive, got {virtual_shards}")
    if virtual_shards % degree != 0:
        raise ValueError(f"TP degree {degree} must divide virtual_shards={virtual_shards}")
    local_pieces = virtual_shards // degree
    if k_local % local_pieces != 0:
        raise ValueError(
            f"local input dim {k_local} (K={k_local * degree}) is not divisible into {local_pieces} "
            f"virtual shards per rank (virtual_shards={virtual_shards}, degree={degree})"
        )
    return local_pieces


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class _AllGatherReplicated(torch.autograd.Function):
    """all_gather for tensor-parallel activations that every rank then uses identically (the
    row-parallel partials, summed into a replicated output): every rank backpropagates the same
    loss, so a rank's own slice of the incoming gradient is its tensor's gradient, with no
    communication (Megatron's gather-from-the-TP-region). ``dist.all_gather`` alone has no
    gradient: the output would silently carry none."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group) -> torch.Tensor:
        ctx.rank = dist.get_rank(group)
        out = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, local.contiguous(), group=group)
        return torch.stack(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad[ctx.rank], None


def all_gather_stacked(local: torch.Tensor, group) -> torch.Tensor:
    """``[d, *local.shape]``: every rank's tensor in rank order (identity at d=1). Differentiable
    for replicated use (``_AllGatherReplicated``)."""
    if group is None:
        return local.unsqueeze(0)
    if torch.is_grad_enabled() and local.requires_grad:
        return _AllGatherReplicated.apply(local, group)
    out = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, local.contiguous(), group=group)
    return torch.stack(out)


def gather_partials(local_partials: Sequence[torch.Tensor], group) -> list[torch.Tensor]:
    """All V partials in global piece order (rank-major, then local piece order)."""
    if group is None:  # TP 1: the local pieces are all pieces; skip the stack/unbind copies
        return list(local_partials)
    stacked = all_gather_stacked(torch.stack(list(local_partials)), group)  # [d, V/d, M, N]
    return list(stacked.reshape(-1, *stacked.shape[2:]).unbind(0))


def virtual_shard_reduce(
    x_local: torch.Tensor,
    weight_local: torch.Tensor,
    group,
    virtual_shards: int,
    gemm_pieces: Callable[[torch.Tensor, torch.Tensor, int], list[torch.Tensor]],
) -> torch.Tensor:
    """Full ``x @ W.T`` (fp32) from this rank's K slice, identical bits at every TP degree.

    ``gemm_pieces(x, w, pieces)`` returns this rank's partials ``[M, N]`` for ``pieces`` equal
    K-slices, in piece order; it runs at every degree and in autograd, so it may choose its kernel
    from the piece shape, never from the degree, and per piece it must give the bits of a call on
    that piece alone."""
    degree = world_size(group)
    local_pieces = check_virtual_shards(x_local.shape[1], degree, virtual_shards)
    partials = gemm_pieces(x_local, weight_local, local_pieces)
    if group is None and not _needs_grad(x_local, weight_local):
        # TP 1 without autograd: the same tree, summed in place
        return tree_sum_fp32_(partials)
    return tree_sum(gather_partials([p.float() for p in partials], group))


def shard_columns(weight: torch.Tensor, degree: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s output-dim slice of a column-parallel weight ``[N, K]``."""
    if weight.shape[0] % degree != 0:
        raise ValueError(f"output dim {weight.shape[0]} not divisible by TP degree {degree}")
    return weight.chunk(degree, dim=0)[rank]


def shard_rows(x: torch.Tensor, weight: torch.Tensor, degree: int, rank: int):
    """Rank ``rank``'s input-dim slices (x[..., K/d], weight[:, K/d]) for a row-parallel linear."""
    if weight.shape[1] % degree != 0:
        raise ValueError(f"input dim {weight.shape[1]} not divisible by TP degree {degree}")
    k = weight.shape[1] // degree
    return x[..., rank * k : (rank + 1) * k], weight[:, rank * k : (rank + 1) * k]


__all__ = [
    "all_gather_stacked",
    "check_virtual_shards",
    "gather_partials",
    "rank_in",
    "shard_columns",
    "shard_rows",
    "tree_sum",
    "tree_sum_fp32_",
    "virtual_shard_reduce",
    "world_size",
]
