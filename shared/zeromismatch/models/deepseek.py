"""DeepSeek-V3-style model (the architecture family of DeepSeek-V4-Flash as configured here):
MLA attention (mla.py), the first ``first_k_dense_replace`` layers with a dense SwiGLU MLP, the
rest with sigmoid-scored, group-limited (``n_group`` / ``topk_group``) routed experts plus
``n_shared_experts`` shared experts, routed weights scaled by ``routed_scaling_factor``.

Not modelled: multi-token-prediction layers (checkpoint tensors ``model.layers.{i}`` with
``i >= num_hidden_layers`` are skipped on load, as transformers does) and YaRN RoPE scaling
(the full-size preset carries it as config only; building it raises a clear error).
"""

from __future__ import annotations

import re

from .dense import TransformerCausalLM
from .layers import DecoderLayer, GatedMLP
from .mla import MLAttention
from .moe import SharedRoutedMoe

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class DeepseekV3ForCausalLM(TransformerCausalLM):
    family = "deepseek_v3"

    def build_layers(self) -> None:
        config, tp = self.config, self.tp
        layers = []
        for kind in config.layer_kinds():
            if kind == "moe":
                mlp = SharedRoutedMoe(config, tp, nemotron=False)
            else:
                mlp = GatedMLP(config.hidden_size, config.intermediate_size, tp)
            layers.append(DecoderLayer(MLAttention(config, tp), mlp, config.hidden_size, config.rms_norm_eps))
        self._setup(layers)

    def _ignorable(self, name: str) -> bool:
        match = _LAYER.match(name)
        if match and int(match.group(1)) >= self.config.num_hidden_layers:
            return True  # multi-token-prediction layers
        return super()._ignorable(name)
