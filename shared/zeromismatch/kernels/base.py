"""The KernelSet contract: every floating-point operation a model performs.

A model built on a KernelSet switches *every* numerically relevant operation by
switching the set (``get_kernels("aligned")`` vs ``get_kernels("default")``).
Model code never calls matmul / softmax / norms directly; it calls these.

Conventions
- Shapes use T for packed tokens (all sequences of a step or micro-batch
  concatenated), S for sequences, H for heads, D for head dim.
- ``cu_seqlens_q`` is int32/int64 ``[S+1]`` offsets into the packed queries.
- Causal attention is *bottom-right aligned*: the q_len queries of sequence s
  are the last q_len positions of its kv_len keys. One call therefore covers a
  full prefill (q_len == kv_len), a chunked prefill (q_len < kv_len) and a
  decode step (q_len == 1), and any mixture of them in one batch.
- Per-row sampling parameters (temperature, top_k, top_p) are tensors of shape
  ``[T]`` so every request in a batch can carry its own.

The aligned set promises that each output row depends only on that row's own
inputs (and, for attention, the keys it attends to) -- never on batch size,
batch neighbours, chunking, phase or tensor-parallel degree. The default set
promises only speed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight stored quantized, plus what is needed to dequantize it.

    format "fp8":   ``data`` float8_e4m3fn ``[out, in]``; ``scales`` fp32, either
                    per output channel ``[out, 1]`` or per block
                    ``[ceil(out/bo), ceil(in/bi)]`` with ``block`` = (bo, bi).
    format "nvfp4": ``data`` uint8 ``[out, in/2]`` (two e2m1 codes per byte, low
                    nibble first); ``scales`` float8_e4m3fn ``[out, in/16]``
                    (one per 16-element block); ``global_scale`` fp32 scalar.
    """

    format: str
    data: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]
    block: tuple[int, int] | None = None
    global_scale: torch.Tensor | None = None


class KernelSet(ABC):
    """Abstract base: one implementation of every op a model uses."""

    #: registry name, e.g. "aligned" or "default"
    name: str = "abstract"
    #: the set promises the bitwise invariances above; the engine and the trainer then re-measure
    #: them once per process on their device and dtype (``kernels.selfcheck.verify_invariance``)
    promises_invariance: bool = False

    # ---- dense algebra -------------------------------------------------
    @abstractmethod
    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``torch.nn.functional.linear`` semantics: weight ``[out, in]``, any leading dims of x."""

    @abstractmethod
    def row_parallel_linear(
        self,
        x_local: torch.Tensor,
        weight_local: torch.Tensor,
        bias: torch.Tensor | None = None,
        group=None,
        virtual_shards: int = 4,
    ) -> torch.Tensor:
        """Row-parallel linear: this rank holds the slice of the input dim (K) that
        ``x_local`` / ``weight_local`` cover; returns the full, reduced output on every
        rank. ``group=None`` means TP degree 1 (x_local is all of K).

        Aligned: K is always cut into ``virtual_shards`` equal pieces whatever the TP
        degree d (d divides virtual_shards); each piece's partial product is computed
        with the same GEMM shape, partials are gathered and summed in one fixed tree,
        so TP 1, 2 and 4 give identical bits. Default: a local GEMM + all_reduce(SUM).
        The bias is added once, after the reduction."""

    @abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm over the last dim, computed in fp32, returned in x.dtype (Qwen3/HF semantics:
        ``weight * (x_f32 * rsqrt(mean(x_f32^2) + eps)).to(x.dtype)``; the default set runs
        torch's fused ``F.rms_norm``, which in bf16 applies the weight before its one rounding)."""

    @abstractmethod
    def gated_rms_norm(
        self, x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int
    ) -> torch.Tensor:
        """Mamba2 gated RMSNorm (Nemotron-H): ``rms_norm_grouped(x * silu(gate))`` with the norm
        taken over groups of ``group_size`` channels; fp32 inside, returned in x.dtype."""

    @abstractmethod
    def rope(
        self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool = False
    ) -> torch.Tensor:
        """Rotary embedding on x ``[T, H, D_rot]`` at integer ``positions [T]``.
        ``inv_freq [D_rot/2]`` fp32. interleaved=False is the HF "rotate_half" layout
        (Qwen3); interleaved=True pairs (2i, 2i+1) (DeepSeek-V3 ``rope_interleave``).
        cos/sin are computed in fp32 from positions, so a token's rotation never depends
        on which other positions are in the call."""

    @abstractmethod
    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` (SwiGLU)."""

    @abstractmethod
    def relu2(self, x: torch.Tensor) -> torch.Tensor:
        """``relu(x) ** 2`` (Nemotron-H MLP activation)."""

    # ---- attention -----------------------------------------------------
    @abstractmethod
    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Causal varlen attention over contiguous packed K/V (the trainer's path).

        q ``[Tq, Hq, Dqk]``, k ``[Tk, Hkv, Dqk]``, v ``[Tk, Hkv, Dv]``; Hq % Hkv == 0 (GQA);
        Dv may differ from Dqk (MLA). Bottom-right aligned causal mask per sequence.
        Returns ``[Tq, Hq, Dv]``."""

    @abstractmethod
    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        kv_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Causal attention over a paged KV cache (the engine's path).

        k_cache ``[num_blocks, block_size, Hkv, Dqk]``, v_cache ``[num_blocks, block_size, Hkv, Dv]``
        (this step's keys already written), block_table ``[S, max_blocks]`` int,
        kv_lens ``[S]`` context length including this step's tokens.
        Aligned: identical bits to ``attention`` for every query, whatever the block
        size, chunking, phase or batch."""

    # ---- head / logprobs -------------------------------------------------
    @abstractmethod
    def lm_head(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Logits ``[T, V]``. Aligned: fp32 on both sides, row-invariant. Default: in the
        activation dtype (a bf16 head when activations are bf16), upcast afterwards."""

    @abstractmethod
    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Raw logprobs of the model distribution over the last dim (fp32 out)."""

    @abstractmethod
    def processed_log_softmax(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
    ) -> torch.Tensor:
        """Logprobs of the distribution the sampler draws from: temperature -> top-k ->
        top-p -> renormalise. Per-row params ``[T]``: temperature 0 means greedy (one-hot,
        logprob 0 at argmax), top_k <= 0 means off, top_p == 1 means off. Masked entries
        are ``-inf``. Ties at the top-k / top-p boundary break by lower token id."""

    # ---- mixture of experts ---------------------------------------------
    @abstractmethod
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
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing weights ``[T, top_k]`` (fp32) and expert ids ``[T, top_k]`` (int64).
        scoring "softmax" (Qwen3-MoE) or "sigmoid" (DeepSeek-V3 / Nemotron-H, where
        ``correction_bias`` only affects selection and n_group/topk_group limit groups).
        Deterministic: ties break by lower expert index."""

    @abstractmethod
    def moe_experts(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        w_gate: torch.Tensor | None,
        w_up: torch.Tensor,
        w_down: torch.Tensor,
        activation: str = "silu",
    ) -> torch.Tensor:
        """Routed experts: for each token, ``sum_j w_j * down_e(act(gate_e(x)) * up_e(x))``
        with e = topk_ids[:, j]. w_gate/w_up ``[E, I, H]``, w_down ``[E, H, I]``;
        activation "silu" (gated, needs w_gate) or "relu2" (w_gate None). The sum over j
        is in ascending j. Aligned: a token's output does not depend on which other
        tokens routed to the same experts."""

    # ---- Mamba2 ------------------------------------------------------------
    @abstractmethod
    def causal_conv1d(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        cu_seqlens: torch.Tensor,
        conv_state: torch.Tensor | None = None,
        activation: str = "silu",
        state_slots: torch.Tensor | None = None,
        has_initial_state: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Depthwise causal conv over packed sequences. x ``[T, C]``, weight ``[C, W]``.
        conv_state ``[S, C, W-1]`` holds each sequence's previous W-1 inputs (zeros for a
        fresh sequence; None = all fresh). With ``state_slots`` (int64 ``[S]``), conv_state is
        a per-slot store ``[N, C, W-1]`` (the engine's cache) and sequence s starts from row
        ``state_slots[s]``, or from zeros where ``has_initial_state[s]`` (bool ``[S]``) is False:
        the same values as passing that gather, read in place. Returns (y ``[T, C]``,
        new_conv_state ``[S, C, W-1]``)."""

    @abstractmethod
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
        state_slots: torch.Tensor | None = None,
        has_initial_state: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mamba2 selective scan over packed sequences.

        x ``[T, Hs, P]`` (heads, head dim), dt ``[T, Hs]`` (pre-softplus), A ``[Hs]`` (negative),
        B, C ``[T, G, N]`` (G groups, state size N; heads map to groups in order), D ``[Hs]``,
        dt_bias ``[Hs]``, ssm_state ``[S, Hs, P, N]`` initial state per sequence (None = zeros), or
        with ``state_slots`` a per-slot store read as in :meth:`causal_conv1d`.
        Returns (y ``[T, Hs, P]``, final state ``[S, Hs, P, N]``). Aligned: running a sequence
        in one call, in chunks of any size, or one token at a time gives identical bits."""

    # ---- quantization ------------------------------------------------------
    @abstractmethod
    def quant_linear(self, x: torch.Tensor, qweight: QuantizedWeight, bias: torch.Tensor | None = None):
        """Linear with a quantized weight. Activation scales, if any, are per row (aligned);
        the default set uses one per-tensor activation scale across the whole batch, as fast
        W8A8 paths do."""
