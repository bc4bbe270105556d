"""What a model forward consumes: one packed batch, in trainer or engine mode.

Both the trainer and the rollout engine describe a forward pass with the same
``ForwardBatch``: tokens of several sequences packed along one axis, with
per-sequence offsets. In *trainer mode* (``cache is None``) every sequence is
complete and contiguous (q_len == kv_len, position 0 first). In *engine mode*
the model reads/writes a ``ModelCache``: ``slot_mapping`` says where each new
token's K/V goes in the paged cache, ``block_table``/``kv_lens`` say what each
sequence attends to, and hybrid models keep per-sequence conv/SSM state in
``state_slots``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kernels.quant import check_kv_cache_dtype


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64, packed tokens of this forward
    positions: torch.Tensor  # [T] int64, absolute position of each token in its sequence
    cu_seqlens_q: torch.Tensor  # [S+1] int64 offsets of each sequence's tokens in this forward
    kv_lens: torch.Tensor  # [S] int64 context length after this forward (== q_len in trainer mode)
    # engine mode only --------------------------------------------------------
    block_table: torch.Tensor | None = None  # [S, max_blocks] int64 paged-cache block ids
    slot_mapping: torch.Tensor | None = None  # [T] int64 flat slot (block * block_size + offset)
    state_slots: torch.Tensor | None = None  # [S] int64 conv/SSM state slot (hybrid models)
    has_initial_state: torch.Tensor | None = None  # [S] bool: continue from stored SSM state

    @property
    def num_seqs(self) -> int:
        return int(self.cu_seqlens_q.numel() - 1)

    @property
    def q_lens(self) -> torch.Tensor:
        return self.cu_seqlens_q[1:] - self.cu_seqlens_q[:-1]

    @staticmethod
    def for_training(sequences: list[torch.Tensor]) -> ForwardBatch:
        """Pack complete sequences (each a 1-D LongTensor starting at position 0)."""
        if not sequences:
            raise ValueError("ForwardBatch.for_training needs at least one sequence")
        lens = torch.tensor([int(s.numel()) for s in sequences], dtype=torch.int64)
        if bool((lens == 0).any()):
            raise ValueError("ForwardBatch.for_training got an empty sequence")
        cu = torch.zeros(len(sequences) + 1, dtype=torch.int64)
        cu[1:] = torch.cumsum(lens, 0)
        positions = torch.cat([torch.arange(int(n), dtype=torch.int64) for n in lens])
        return ForwardBatch(
            input_ids=torch.cat([s.to(torch.int64) for s in sequences]),
            positions=positions,
            cu_seqlens_q=cu,
            kv_lens=lens,
        )


@dataclass
class ModelCache:
    """Per-layer engine state. Attention layers own paged K/V; Mamba layers own
    conv and SSM state per slot. Entries for layers of the other kind are None.

    ``kv_cache_dtype="fp8_e4m3"`` (vLLM's name): every K/V written to the paged cache is first
    rounded through e4m3 with its layer's ``k_scale`` / ``v_scale`` (``kernels/quant.py::
    fp8_kv_roundtrip``); the tensors stay in the activation dtype and hold the dequantized values
    (an emulation: no memory is saved). Conv/SSM state is never rounded (vLLM's kv_cache_dtype
    does not cover Mamba state). The scales are fp32 scalar tensors, one per attention layer (None
    elsewhere, and everywhere with ``"auto"``); ``CausalLM.allocate_cache`` sets them all to 1.0
    and nothing changes them (the rule is explained there)."""

    block_size: int
    num_blocks: int
    k_cache: list[torch.Tensor | None] = field(default_factory=list)  # [num_blocks, block_size, Hkv, Dqk]
    v_cache: list[torch.Tensor | None] = field(default_factory=list)  # [num_blocks, block_size, Hkv, Dv]
    conv_state: list[torch.Tensor | None] = field(default_factory=list)  # [max_seqs, C, W-1]
    ssm_state: list[torch.Tensor | None] = field(default_factory=list)  # [max_seqs, Hs, P, N]
    #: per-layer conv/SSM state slots ``[S]`` overriding ``batch.state_slots`` (None: the batch's for
    #: every layer); vLLM's hybrid allocator gives each group of Mamba layers its own block per request
    state_slots: list[torch.Tensor | None] | None = None
    kv_cache_dtype: str = "auto"  # "auto" (the activation dtype) or "fp8_e4m3"
    k_scale: list[torch.Tensor | None] = field(default_factory=list)  # [] fp32, fp8_e4m3 only
    v_scale: list[torch.Tensor | None] = field(default_factory=list)  # [] fp32, fp8_e4m3 only

    def __post_init__(self):
        check_kv_cache_dtype(self.kv_cache_dtype)

    @property
    def fp8(self) -> bool:
        """Whether K/V are rounded through e4m3 before they are cached."""
        return self.kv_cache_dtype == "fp8_e4m3"
