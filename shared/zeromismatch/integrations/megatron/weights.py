"""HF <-> Megatron weight maps: which HF tensors make each Megatron parameter, and how it is split
over tensor-parallel ranks.

Each Megatron parameter has one ``TensorMap``: its HF source tensors and a ``kind``:

- ``replicated``: the HF tensor itself, on every rank (norms).
- ``rows`` / ``cols``: the HF tensor, split along dim 0 / dim 1 in rank order (vocab-parallel
  embedding and output layer, column- and row-parallel linears).
- ``qkv``: Megatron's fused ``linear_qkv``: per query group g, that group's q heads, then its k
  head, then its v head (``[q_g; k_g; v_g]`` for g = 0..G-1), split by rows: rank r holds
  groups ``r*G/d .. (r+1)*G/d - 1``, i.e. the contiguous heads the project's q/k/v shards hold.
- ``gate_up``: the gated ``linear_fc1``: on each rank ``[gate_r; up_r]``, its slices of gate and
  of up (Megatron's stride-2 layout), so TP 1 holds ``[gate; up]``.
- ``experts``: one projection of every routed expert, stacked ``[E, ...]`` in expert order, on every
  rank (HF: one tensor per expert).

``to_megatron`` builds a rank's parameter from full HF tensors, ``to_hf`` the full HF tensors from
every rank's parameter (in rank order): exact copies and reshapes, no arithmetic, so HF ->
Megatron -> HF returns the same bytes. ``family_maps`` lists a family's maps (``qwen3_maps``: Qwen3,
Qwen3-MoE, DeepSeek-V3; ``nemotron_h_maps``); the model checks at build time that they name exactly
its parameters and persistent buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...models.config import ModelConfig

KINDS = ("replicated", "rows", "cols", "qkv", "gate_up", "experts")
#: kinds every TP rank holds whole (nothing to gather)
REPLICATED_KINDS = ("replicated", "experts")


@dataclass(frozen=True)
class TensorMap:
    megatron: str  # parameter name in the GPTModel
    hf: tuple[str, ...]  # HF tensors it is made of, in order
    kind: str
    groups: int = 1  # qkv: query groups (KV heads); heads per group and head dim follow from shapes
    heads_per_group: int = 1

    def to_megatron(self, tensors: list[torch.Tensor], rank: int, size: int) -> torch.Tensor:
        """This rank's parameter from the full HF tensors."""
        if self.kind == "replicated":
            return tensors[0]
        if self.kind == "experts":
            return torch.stack(tensors)
        if self.kind in ("rows", "cols"):
            return _chunk(tensors[0], 0 if self.kind == "rows" else 1, rank, size, self.hf[0])
        if self.kind == "qkv":
            return _chunk(self._interleave(*tensors), 0, rank, size, self.megatron)
        gate, up = tensors  # gate_up
        return torch.cat([_chunk(gate, 0, rank, size, self.hf[0]), _chunk(up, 0, rank, size, self.hf[1])])

    def to_hf(self, per_rank: list[torch.Tensor]) -> list[torch.Tensor]:
        """The full HF tensors from every rank's parameter (rank order)."""
        if self.kind == "replicated":
            return [per_rank[0]]
        if self.kind == "experts":
            return list(per_rank[0].unbind(0))
        if self.kind in ("rows", "cols"):
            return [torch.cat(per_rank, dim=0 if self.kind == "rows" else 1)]
        if self.kind == "qkv":
            return self._deinterleave(torch.cat(per_rank, dim=0))
        halves = [torch.chunk(local, 2, dim=0) for local in per_rank]  # gate_up
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]

    def _interleave(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        g = self.groups
        parts = (q.reshape(g, -1, q.shape[-1]), k.reshape(g, -1, k.shape[-1]), v.reshape(g, -1, v.shape[-1]))
        return torch.cat(parts, dim=1).reshape(-1, q.shape[-1])

    def _deinterleave(self, fused: torch.Tensor) -> list[torch.Tensor]:
        g, hidden = self.groups, fused.shape[-1]
        per_group = fused.reshape(g, -1, hidden)
        head_dim = per_group.shape[1] // (self.heads_per_group + 2)
        q_rows = self.heads_per_group * head_dim
        q, k, v = torch.split(per_group, [q_rows, head_dim, head_dim], dim=1)
        return [t.reshape(-1, hidden) for t in (q, k, v)]

    def hf_shapes(self, full_megatron_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The full HF shapes this map expects, from the parameter's full (TP 1) shape."""
        return [tuple(t.shape) for t in self.to_hf([torch.empty(full_megatron_shape, device="meta")])]


def _chunk(full: torch.Tensor, dim: int, rank: int, size: int, name: str) -> torch.Tensor:
    if full.shape[dim] % size:
        raise ValueError(f"{name}: dim {dim} of size {full.shape[dim]} is not divisible by TP degree {size}")
    step = full.shape[dim] // size
    return full.narrow(dim, rank * step, step)


def attention_maps(config: ModelConfig, megatron: str, hf: str) -> list[TensorMap]:
    """Qwen3 attention (``hf`` = ``model.layers.i.self_attn``)."""
    groups = config.num_key_value_heads
    per_group = config.num_attention_heads // groups
    qkv = tuple(f"{hf}.{p}_proj.weight" for p in "qkv")
    return [
        TensorMap(f"{megatron}.linear_qkv.weight", qkv, "qkv", groups=groups, heads_per_group=per_group),
        TensorMap(f"{megatron}.q_layernorm.weight", (f"{hf}.q_norm.weight",), "replicated"),
        TensorMap(f"{megatron}.k_layernorm.weight", (f"{hf}.k_norm.weight",), "replicated"),
        TensorMap(f"{megatron}.linear_proj.weight", (f"{hf}.o_proj.weight",), "cols"),
    ]


def gated_mlp_maps(megatron: str, hf: str) -> list[TensorMap]:
    gate_up = (f"{hf}.gate_proj.weight", f"{hf}.up_proj.weight")
    return [
        TensorMap(f"{megatron}.linear_fc1.weight", gate_up, "gate_up"),
        TensorMap(f"{megatron}.linear_fc2.weight", (f"{hf}.down_proj.weight",), "cols"),
    ]


def _norm(megatron: str, hf: str) -> TensorMap:
    return TensorMap(f"{megatron}.weight", (f"{hf}.weight",), "replicated")


def softmax_moe_maps(config: ModelConfig, megatron: str, hf: str) -> list[TensorMap]:
    """Qwen3-MoE's router (``mlp.gate``) and per-expert projections (``mlp.experts.{e}.*``)."""
    experts = range(config.num_experts)
    maps = [TensorMap(f"{megatron}.router.weight", (f"{hf}.gate.weight",), "replicated")]
    for proj in ("gate", "up", "down"):
        names = tuple(f"{hf}.experts.{e}.{proj}_proj.weight" for e in experts)
        maps.append(TensorMap(f"{megatron}.experts.{proj}_weight", names, "experts"))
    return maps


def mla_maps(config: ModelConfig, megatron: str, hf: str) -> list[TensorMap]:
    """DeepSeek-V3 MLA (``hf`` = ``model.layers.i.self_attn``): Megatron's MLA names."""

    def one(meg: str, hf_name: str, kind: str) -> TensorMap:
        return TensorMap(f"{megatron}.{meg}.weight", (f"{hf}.{hf_name}.weight",), kind)

    if config.q_lora_rank is None:
        maps = [one("linear_q_proj", "q_proj", "rows")]
    else:
        maps = [one("linear_q_down_proj", "q_a_proj", "replicated"),
                one("q_layernorm", "q_a_layernorm", "replicated"),
                one("linear_q_up_proj", "q_b_proj", "rows")]  # fmt: skip
    return maps + [
        one("linear_kv_down_proj", "kv_a_proj_with_mqa", "replicated"),
        one("kv_layernorm", "kv_a_layernorm", "replicated"),
        one("linear_kv_up_proj", "kv_b_proj", "rows"),
        one("linear_proj", "o_proj", "cols"),
    ]


def shared_routed_moe_maps(config: ModelConfig, megatron: str, hf: str) -> list[TensorMap]:
    """DeepSeek-V3's sigmoid router (weight and the ``e_score_correction_bias`` buffer, fp32), its
    stacked routed experts and its shared experts (a gated MLP)."""
    maps = [
        TensorMap(f"{megatron}.router.weight", (f"{hf}.gate.weight",), "replicated"),
        TensorMap(
            f"{megatron}.router.e_score_correction_bias",
            (f"{hf}.gate.e_score_correction_bias",),
            "replicated",
        ),  # fmt: skip
    ]
    for proj in ("gate", "up", "down"):
        names = tuple(f"{hf}.experts.{e}.{proj}_proj.weight" for e in range(config.num_experts))
        maps.append(TensorMap(f"{megatron}.experts.{proj}_weight", names, "experts"))
    return maps + gated_mlp_maps(f"{megatron}.shared_experts", f"{hf}.shared_experts")


def qwen3_maps(config: ModelConfig) -> list[TensorMap]:
    """Every parameter of a Qwen3, Qwen3-MoE or DeepSeek-V3 ``GPTModel`` and its HF tensors."""
    maps = [TensorMap("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "rows")]
    deepseek = config.family == "deepseek_v3"
    for i, kind in enumerate(config.layer_kinds()):
        meg, hf = f"decoder.layers.{i}", f"model.layers.{i}"
        maps.append(_norm(f"{meg}.input_layernorm", f"{hf}.input_layernorm"))
        if deepseek:
            maps += mla_maps(config, f"{meg}.self_attention", f"{hf}.self_attn")
        else:
            maps += attention_maps(config, f"{meg}.self_attention", f"{hf}.self_attn")
        maps.append(_norm(f"{meg}.pre_mlp_layernorm", f"{hf}.post_attention_layernorm"))
        if kind == "moe" and deepseek:
            maps += shared_routed_moe_maps(config, f"{meg}.mlp", f"{hf}.mlp")
        elif kind == "moe":
            maps += softmax_moe_maps(config, f"{meg}.mlp", f"{hf}.mlp")
        else:
            maps += gated_mlp_maps(f"{meg}.mlp", f"{hf}.mlp")
    maps.append(TensorMap("decoder.final_layernorm.weight", ("model.norm.weight",), "replicated"))
    if not config.tie_word_embeddings:
        maps.append(TensorMap("output_layer.weight", ("lm_head.weight",), "rows"))
    return maps


def nemotron_h_maps(config: ModelConfig) -> list[TensorMap]:
    """Every parameter of a Nemotron-H ``MambaModel`` (``backbone.*`` in HF; one pre-norm per block,
    which Megatron calls ``norm`` / ``input_layernorm`` / ``pre_mlp_layernorm`` by layer kind; the
    LM head is never tied, as in transformers)."""
    maps = [TensorMap("embedding.word_embeddings.weight", ("backbone.embeddings.weight",), "rows")]
    norm_name = {"linear_attention": "norm", "full_attention": "input_layernorm"}
    for i, kind in enumerate(config.layer_kinds()):
        meg, hf = f"decoder.layers.{i}", f"backbone.layers.{i}"
        mixer = f"{hf}.mixer"
        maps.append(_norm(f"{meg}.{norm_name.get(kind, 'pre_mlp_layernorm')}", f"{hf}.norm"))
        if kind == "linear_attention":
            for name in ("in_proj.weight", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D",
                         "norm.weight", "out_proj.weight"):  # fmt: skip
                if name != "conv1d.bias" or config.use_conv_bias:
                    maps.append(TensorMap(f"{meg}.mixer.{name}", (f"{mixer}.{name}",), "replicated"))
        elif kind == "full_attention":
            maps += attention_maps(config, f"{meg}.self_attention", mixer)[::3]  # linear_qkv, linear_proj
        elif kind == "mlp":
            maps += relu2_mlp_maps(f"{meg}.mlp", mixer)
        else:
            maps += nemotron_moe_maps(config, f"{meg}.mlp", mixer)
    maps.append(TensorMap("decoder.final_norm.weight", ("backbone.norm_f.weight",), "replicated"))
    return maps + [TensorMap("output_layer.weight", ("lm_head.weight",), "rows")]


def relu2_mlp_maps(megatron: str, hf: str) -> list[TensorMap]:
    return [
        TensorMap(f"{megatron}.linear_fc1.weight", (f"{hf}.up_proj.weight",), "rows"),
        TensorMap(f"{megatron}.linear_fc2.weight", (f"{hf}.down_proj.weight",), "cols"),
    ]


def nemotron_moe_maps(config: ModelConfig, megatron: str, hf: str) -> list[TensorMap]:
    """Nemotron-H's sigmoid router, relu2 routed experts (no gate), optional latent projections and
    relu2 shared expert."""
    maps = shared_routed_moe_maps(config, megatron, hf)[:2]
    for proj in ("up", "down"):
        names = tuple(f"{hf}.experts.{e}.{proj}_proj.weight" for e in range(config.num_experts))
        maps.append(TensorMap(f"{megatron}.experts.{proj}_weight", names, "experts"))
    if config.moe_latent_size is not None:
        for proj in ("fc1_latent_proj", "fc2_latent_proj"):
            maps.append(TensorMap(f"{megatron}.{proj}.weight", (f"{hf}.{proj}.weight",), "replicated"))
    return maps + relu2_mlp_maps(f"{megatron}.shared_experts", f"{hf}.shared_experts")


def family_maps(config: ModelConfig) -> list[TensorMap]:
    if config.family in ("qwen3", "qwen3_moe", "deepseek_v3"):
        return qwen3_maps(config)
    if config.family == "nemotron_h":
        return nemotron_h_maps(config)
    raise ValueError(f"no Megatron weight map for family {config.family!r}")


def full_shape(kind: str, local_shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    """A parameter's TP 1 shape from its shape on one of ``size`` ranks."""
    shape = list(local_shape)
    if kind in ("rows", "qkv", "gate_up"):
        shape[0] *= size
    elif kind == "cols":
        shape[1] *= size
    return tuple(shape)
