"""A vLLM worker extension: loads the learner's weights into the plugin model of a running vLLM, and
reports the plugin model's step-graph counts.

vLLM mixes ``worker_extension_cls`` into its worker class, so ``LLM.collective_rpc(name, args)``
calls a method of it in every worker process, its arguments carried by vLLM's msgpack encoder:
the RL-weight-sync path vLLM documents, without pickling code into the engine process.
``engine.VllmEngine`` starts vLLM with it. The RPC's arguments are decoded untyped, so a tensor
travels as its raw bytes with dtype and shape (``pack`` / ``unpack``), bit for bit.
"""

from __future__ import annotations

import torch

Packed = tuple[str, list[int], bytes]


def pack(tensor: torch.Tensor) -> Packed:
    tensor = tensor.detach().contiguous()
    data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
    return str(tensor.dtype).removeprefix("torch."), list(tensor.shape), data


def unpack(packed: Packed) -> torch.Tensor:
    dtype, shape, data = packed
    return torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)).view(shape)


class PluginWorker:
    def zeromismatch_load_weights(self, weights: dict[str, Packed]) -> int:
        """Replace every weight of the served model with ``weights`` (HF names, the full set, packed
        in the model's dtype); returns how many tensors were loaded."""
        model = self.model_runner.get_model()
        model.load_weights((name, unpack(packed)) for name, packed in weights.items())
        return len(weights)

    def zeromismatch_step_graph_stats(self) -> dict:
        """The served plugin model's step-graph counts (``DecodeGraphs.stats``)."""
        return self.model_runner.get_model().graphs.stats()
