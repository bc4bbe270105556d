"""The aligned kernel set: invariant CPU reference in pure torch.

Each method delegates to a module function of the same name, so each op family
lives in its own file: dense.py / gemm.py (GEMMs, norms, RoPE, activations, lm_head
and logprobs, quantized linear), attention.py (split-KV attention over contiguous
or paged K/V), moe.py (routing and experts), ssm.py (causal conv and Mamba2 scan).
The invariance argument for every op is in docs/parity.md.
"""

from __future__ import annotations

import torch

from ..base import KernelSet, QuantizedWeight
from . import attention, dense, moe, ssm


class AlignedKernels(KernelSet):
    name = "aligned"

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
        return dense.linear(x, weight, bias)

    def row_parallel_linear(
        self,
        x_local: torch.Tensor,
        weight_local: torch.Tensor,
        bias: torch.Tensor | None = None,
        group=None,
        virtual_shards: int = 4,
    ):
        return dense.row_parallel_linear(x_local, weight_local, bias, group, virtual_shards)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float):
        return dense.rms_norm(x, weight, eps)

    def gated_rms_norm(
        self, x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int
    ):
        return dense.gated_rms_norm(x, gate, weight, eps, group_size)

    def rope(
        self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool = False
    ):
        return dense.rope(x, positions, inv_freq, interleaved)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor):
        return dense.silu_mul(gate, up)

    def relu2(self, x: torch.Tensor):
        return dense.relu2(x)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        scale: float,
    ):
        return attention.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale)

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        kv_lens: torch.Tensor,
        scale: float,
    ):
        return attention.paged_attention(q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens, scale)

    def lm_head(self, hidden: torch.Tensor, weight: torch.Tensor):
        return dense.lm_head(hidden, weight)

    def log_softmax(self, logits: torch.Tensor):
        return dense.log_softmax(logits)

    def processed_log_softmax(
        self, logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
    ):
        return dense.processed_log_softmax(logits, temperature, top_k, top_p)

    def moe_route(
        self,
        router_logits: torch.Tensor,
        top_k: int,
        scoring: str = "softmax",
        norm_topk_prob: bool = True,
        correction_bias: torch.Tensor | None = None,
        n_group: int = 1,
        topk_group: int = 1,
        routed_scaling_factor: float = 1.0,
    ):
        return moe.moe_route(
            router_logits,
            top_k,
            scoring,
            norm_topk_prob,
            correction_bias,
            n_group,
            topk_group,
            routed_scaling_factor,
        )

    def moe_experts(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        w_gate: torch.Tensor | None,
        w_up: torch.Tensor,
        w_down: torch.Tensor,
        activation: str = "silu",
    ):
        return moe.moe_experts(x, topk_weights, topk_ids, w_gate, w_up, w_down, activation)

    def causal_conv1d(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        cu_seqlens: torch.Tensor,
        conv_state: torch.Tensor | None = None,
        activation: str = "silu",
    ):
        return ssm.causal_conv1d(x, weight, bias, cu_seqlens, conv_state, activation)

    def ssm_scan(
        self,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        D: torch.Tensor,
        dt_bias: torch.Tensor,
        cu_seqlens: torch.Tensor,
        ssm_state: torch.Tensor | None = None,
        dt_limit: tuple[float, float] = (0.0, float("inf")),
    ):
        return ssm.ssm_scan(x, dt, A, B, C, D, dt_bias, cu_seqlens, ssm_state, dt_limit)

    def quant_linear(self, x: torch.Tensor, qweight: QuantizedWeight, bias: torch.Tensor | None = None):
        return dense.quant_linear(x, qweight, bias)
