"""``run_bisect``: both sides, the comparison, the downstream logprob effect; text and JSON.

The downstream effect is the per-token logprob mismatch of the teacher-forced response
tokens (``metrics.mismatch.logprob_diff_stats``: diff = trainer - rollout; max, mean, std,
k3), the quantity ``zm parity`` measures, plus which tokens differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .compare import Comparison, SiteDiff, bits_equal, compare_records
from .driver import DTYPES, BisectConfig, SideRun, config_dict, run_sides


@dataclass
class BisectResult:
    config: BisectConfig
    prompts: list[list[int]]
    responses: list[list[int]]
    rollout: SideRun
    trainer: SideRun
    comparison: Comparison
    logprob_stats: dict
    token_diffs: list[dict]  # per response token: seq, index, position, rollout, trainer, diff

    @property
    def first(self) -> SiteDiff | None:
        return self.comparison.first

    @property
    def diverged(self) -> bool:
        return self.first is not None

    def engine_forward_of(self, call_index: int) -> dict:
        group = self.rollout.records[call_index].group
        return (
            {"forward": group, **self.rollout.forwards[group]} if group < len(self.rollout.forwards) else {}
        )

    def to_dict(self) -> dict:
        first = self.first
        out = {
            "config": config_dict(self.config),
            "numerics": {side: self.config.numerics(side) for side in ("rollout", "trainer")},
            "diverged": self.diverged,
            "first_divergence": None,
            "perturbation": self.rollout.perturbation,
            "sequences": [
                {"prompt_len": len(p), "response_len": len(r)} for p, r in zip(self.prompts, self.responses)
            ],
            "rollout_forwards": self.rollout.forwards,
            "logprob_diff": self.logprob_stats,
            "token_diffs": self.token_diffs,
            **{k: v for k, v in self.comparison.to_dict().items() if k != "first"},
        }
        if first is not None:
            out["first_divergence"] = {
                **self.comparison.to_dict()["first"],
                "engine_forward": self.engine_forward_of(first.first_engine_call),
            }
        return out


def token_diffs(prompts, rollout: list[torch.Tensor], trainer: list[torch.Tensor]) -> list[dict]:
    rows = []
    for seq, (prompt, lp_r, lp_t) in enumerate(zip(prompts, rollout, trainer)):
        for index, (a, b) in enumerate(zip(lp_r.tolist(), lp_t.tolist())):
            same = bits_equal(lp_r[index], lp_t[index])
            rows.append(
                {
                    "seq": seq,
                    "index": index,
                    "position": len(prompt) - 1 + index,
                    "rollout": a,
                    "trainer": b,
                    "diff": 0.0 if same else b - a,
                    "identical": same,
                }
            )
    return rows


def downstream_stats(rollout: torch.Tensor, trainer: torch.Tensor) -> dict:
    """``support_aware_diff_stats``: forced tokens outside the top-k / top-p support have logprob
    -inf; they are counted (``nonfinite_tokens``) and still take part in ``identical``, which here
    compares every token's bits (``bits_equal``: nan payloads included)."""
    from ..metrics.mismatch import support_aware_diff_stats

    stats = support_aware_diff_stats(rollout, trainer)
    stats["identical"] = bits_equal(rollout, trainer)
    return stats


def run_bisect(config: BisectConfig, trainer: SideRun | None = None) -> BisectResult:
    """Run the engine side in the rollout numerics (``config.rollout_kernels``, the rollout dtype,
    format, KV cache and head) and the trainer side in the trainer's (``config.trainer_kernels``,
    ``dtype``, ``quant``) on the same tokens and find the first diverging op.
    ``trainer`` reuses a previous result's trainer side (``result.trainer``)."""
    rollout, trainer, prompts, responses = run_sides(config, trainer)
    comparison = compare_records(rollout.records, trainer.records)
    stats = downstream_stats(torch.cat(rollout.logprobs), torch.cat(trainer.logprobs))
    return BisectResult(
        config,
        prompts,
        responses,
        rollout,
        trainer,
        comparison,
        stats,
        token_diffs(prompts, rollout.logprobs, trainer.logprobs),
    )


def _fmt(x: float) -> str:
    return "0" if x == 0 else f"{x:.3g}"


def _describe_forward(forward: dict) -> str:
    parts = []
    for chunk in forward.get("chunks", []):
        end = chunk["start"] + chunk["tokens"]
        kind = (
            "decode"
            if chunk["tokens"] == 1 and chunk["start"] > 0
            else ("prefill" if chunk["start"] == 0 else "prefill chunk")
        )
        parts.append(f"seq {chunk['seq']} {kind} [{chunk['start']},{end})")
    return f"{forward.get('tokens', '?')} rows: " + ", ".join(parts)


def describe_numerics(numerics: dict) -> str:
    """One side's numerics in words (``BisectConfig.numerics``)."""
    text = f"kernels {numerics['kernels']}, {numerics['dtype']}, weights {numerics['quant']}"
    if "kv_cache_dtype" in numerics:  # the engine
        text += f", KV cache {numerics['kv_cache_dtype']}, lm_head {numerics['lm_head']}"
    elif numerics["quant"] != "none":  # the learner: master weights, fake-quantized in the forward
        text += " (fake-quantized masters)"
    return text


_OUTSIDE_WORDS = {"activation-lm-head": "outside the KernelSet: a torch linear in the activation dtype"}


def _inputs_line(result: BisectResult, first: SiteDiff) -> str:
    """Why the first differing op differs, as far as its inputs tell."""
    if first.inputs_identical is None:
        return "not checked"
    across = " in value" if first.compared == "values" else " bitwise"
    if first.inputs_identical and first.op == "attention" and result.config.kv_cache_dtype != "auto":
        return f"the queries are identical{across}; the K/V it reads are not (see the note)"
    if first.inputs_identical:
        return f"identical{across} -> the op itself diverges"
    if first.input_max_abs_diff:
        cfg = result.config
        where = (
            f" (the rollout holds its weights in {cfg.numerics('rollout')['dtype']}, the trainer in "
            f"{cfg.numerics('trainer')['dtype']}: the embedding lookup before layer 0 is not a kernel op)"
            if DTYPES[cfg.engine_dtype] != DTYPES[cfg.dtype]
            else ""
        )
        return (
            f"the row inputs differ already (max abs diff {_fmt(first.input_max_abs_diff)}), yet no earlier "
            f"op does: they changed outside the recorded kernel calls{where}"
        )
    return "row inputs identical, but the weights differ -> the weights diverge, not the op"


def format_text(result: BisectResult, max_sites: int = 12) -> str:
    cfg, cmp = result.config, result.comparison
    total_positions = sum(len(p) + len(r) - 1 for p, r in zip(result.prompts, result.responses))
    lines = [
        f"zm bisect  model={cfg.model}  seed={cfg.seed}",
        f"rollout: {describe_numerics(cfg.numerics('rollout'))}",
        f"trainer: {describe_numerics(cfg.numerics('trainer'))}",
        f"tokens: {len(result.prompts)} sequences, {total_positions} positions; rollout: "
        f"{len(result.rollout.forwards)} engine forwards; trainer: 1 packed forward",
    ]
    if result.rollout.perturbation is not None:
        p = result.rollout.perturbation
        lines.append(
            f"perturbation: {cfg.perturb} -> engine call #{p['call_index']} ({p['path'] or '(head)'}), "
            f"element {p['element']}: {p['before']!r} -> {p['after']!r}"
        )
    differing = [s for s in cmp.sites if s.diverges]
    lines.append(
        f"sites compared: {len(cmp.sites)} ({sum(s.rows_compared for s in cmp.sites)} rows); "
        f"differing: {len(differing)}"
    )
    if cmp.trainer_only_sites or cmp.engine_only_sites:
        lines.append(
            f"unmatched sites: trainer-only {cmp.trainer_only_sites}, engine-only {cmp.engine_only_sites}"
        )
    lines.append("")
    first = result.first
    if first is None:
        lines.append(
            "no divergence: every compared op output is identical (bitwise; in value where the dtypes differ)"
        )
    else:
        forward = result.engine_forward_of(first.first_engine_call)
        engine_op = first.engine_op if first.engine_op != first.op else "same"
        if first.engine_outside:
            engine_op += f", {_OUTSIDE_WORDS.get(first.engine_outside, first.engine_outside)}"
        compared = (
            "bitwise (one dtype)"
            if first.compared == "bits"
            else f"by value in float64 (rollout {'/'.join(first.engine_dtypes or [])} vs trainer "
            f"{'/'.join(first.trainer_dtypes)}: their bits differ by definition)"
        )
        lines += [
            "FIRST DIVERGENCE",
            f"  op            {first.op} (engine: {engine_op})",
            f"  layer         {first.layer}",
            f"  site          {first.path or '(head)'}  occurrence {first.occurrence}",
            f"  rows          {first.rows_differing} of {first.rows_compared} differ; first at sequence "
            f"{first.first_row[0]}, position {first.first_row[1]}",
            f"  compared      {compared}",
            f"  max abs diff  {_fmt(first.max_abs_diff)}    max rel diff  {_fmt(first.max_rel_diff)}",
            f"  trainer       call #{first.trainer_call}: {first.trainer_shape} "
            f"{'/'.join(first.trainer_dtypes)} (one packed forward){_cols(first.trainer_cols)}",
            f"  engine        call #{first.first_engine_call}: {first.engine_shape} "
            f"{'/'.join(first.engine_dtypes or [])}{_cols(first.engine_cols)} "
            f"(forward {forward.get('forward')}: {_describe_forward(forward)})",
            f"  inputs        {_inputs_line(result, first)}",
        ]
        if first.trainer_weights or first.engine_weights:
            lines.append(
                f"  weights       trainer {', '.join(first.trainer_weights or []) or '-'}; "
                f"engine {', '.join(first.engine_weights or []) or '-'}"
            )
        if first.op == "attention" and cfg.kv_cache_dtype != "auto":
            lines.append(
                f"  note          the engine's K/V went through its {cfg.kv_cache_dtype} cache (rounded "
                "before paged_attention reads them); the trainer attends to unrounded K/V"
            )
    stats = result.logprob_stats
    n_diff = sum(1 for t in result.token_diffs if not t["identical"])
    lines += [
        "",
        "DOWNSTREAM: per-token logprob, diff = trainer - rollout",
        f"  diff_max {_fmt(stats['diff_max'])}  diff_mean {_fmt(stats['diff_mean'])}  "
        f"diff_std {_fmt(stats['diff_std'])}  k3_kl {_fmt(stats['k3_kl'])}  "
        f"tokens {stats['tokens']}  differing {n_diff}",
    ]
    if stats["nonfinite_tokens"]:
        lines.append(
            f"  ({stats['nonfinite_tokens']} forced tokens outside the top-k/top-p support have logprob "
            "-inf and are left out of the four statistics; 'differing' counts them by their bits)"
        )
    if differing:
        lines += [
            "",
            f"DIFFERING SITES (first {min(max_sites, len(differing))} of {len(differing)}, trainer order)",
        ]
        lines.append(f"  {'layer':>5}  {'op':<22} {'site':<46} {'rows':>9}  {'max abs':>9}")
        for site in differing[:max_sites]:
            where = f"{site.path or '(head)'}#{site.occurrence}"
            lines.append(
                f"  {site.layer!s:>5}  {site.op:<22} {where:<46} "
                f"{site.rows_differing:>4}/{site.rows_compared:<4}  {_fmt(site.max_abs_diff):>9}"
            )
    return "\n".join(lines)


def _cols(cols: list[int] | None) -> str:
    return "" if cols is None else f", columns [{cols[0]}, {cols[1]}) of a fused projection"
