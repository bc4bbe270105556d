"""Weight updates for the engine: validation and the three in-flight modes.

``update_weights(weights, mode)`` swaps the model's weights and increments the
engine's weight version. What happens to requests that are in flight is explicit
(S2 fix 3):
- "keep":  in-flight requests are frozen during the swap and resumed under the new
  weights; every token records the version that sampled it. With
  ``recompute_kv=True`` (default) their cached K/V / SSM state is dropped and
  re-prefilled under the new weights, so every token's logprob is a function of one
  version's weights and recomputes bitwise with them. ``recompute_kv=False`` keeps the
  stale state (what V0-style in-flight updates do): cheaper, but tokens sampled after
  the update see state from two versions and match *no* single-version recompute.
- "wait":  drain -- run every in-flight request to completion under the old weights,
  then swap.
- "abort": stop every in-flight request now; its partial output is returned marked
  aborted (finish_reason "abort").
Weights are a name -> tensor mapping in the model's HF naming (``state_dict_hf``); a
subset is allowed, unknown names and shape mismatches are rejected before anything
changes, and so is an empty mapping (it would bump the version and change nothing, so two
versions would name the same weights). Floating dtypes other than the model's are cast on load
(an fp32 learner feeding a bf16 rollout is the stock stack's path), except fp64 into a model that
is not fp64: no trainer here produces fp64 weights (it is numpy's default dtype, e.g. a
``torch.from_numpy`` of a float64 array), and the cast would round them to values the caller
does not hold, so it is refused naming the weight.
"""

from __future__ import annotations

import torch

UPDATE_MODES = ("keep", "wait", "abort")


def validate_update_mode(mode: str) -> None:
    if mode not in UPDATE_MODES:
        raise ValueError(f"update_weights mode must be one of {UPDATE_MODES}, got {mode!r}")


def _expected_shapes(model) -> dict[str, tuple[int, ...]]:
    if hasattr(model, "hf_tensor_shapes"):
        return {name: tuple(shape) for name, shape in model.hf_tensor_shapes().items()}
    return {name: tuple(t.shape) for name, t in model.state_dict_hf().items()}


def merged_state_dict(model, weights) -> dict[str, torch.Tensor]:
    """A full HF state dict for ``model``: ``weights`` checked for names, shapes, dtype and
    finiteness, completed from the model's current weights when it is a subset."""
    if not hasattr(weights, "items"):
        raise TypeError(f"update_weights expects a mapping name -> tensor, got {type(weights).__name__}")
    if not weights:
        raise ValueError(
            "update_weights: no weights given; an empty update would bump the weight version "
            "and change nothing"
        )
    expected = _expected_shapes(model)
    model_dtype = getattr(model, "dtype", None)
    unknown = sorted(set(weights) - set(expected))
    if unknown:
        more = " ..." if len(unknown) > 5 else ""
        raise ValueError(f"update_weights: unknown weight names {unknown[:5]}{more}")
    bad = []
    for name, tensor in weights.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"update_weights: weight {name!r} is a {type(tensor).__name__}, not a tensor")
        if tuple(tensor.shape) != expected[name]:
            bad.append(f"{name}: got {tuple(tensor.shape)}, expected {expected[name]}")
        elif not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"update_weights: weight {name!r} is not a finite floating-point tensor")
        elif tensor.dtype == torch.float64 and model_dtype != torch.float64:
            raise ValueError(
                f"update_weights: weight {name!r} is float64 but the model holds "
                f"{model_dtype or 'another dtype'}; casting would round it silently: convert it to the "
                "model's dtype first"
            )
    if bad:
        raise ValueError("update_weights: shape mismatch: " + "; ".join(bad[:5]))
    if set(weights) == set(expected):
        return dict(weights)
    merged = model.state_dict_hf()  # a partial update (dense models only)
    merged.update(weights)
    return merged
