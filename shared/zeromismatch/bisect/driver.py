"""Run the same tokens through the rollout engine and the trainer, each in its own numerics
(kernel set, dtype, weight format; the engine's KV cache and lm_head), recording every kernel
call on both sides.

Tokens. ``--seed`` draws ``num_seqs`` (prompt, response) pairs of random lengths; both sides
see exactly these tokens (teacher forcing), so every op output row can be matched by its
token identity (sequence id, position).

Weights. The trainer's model is the RL learner's (``engine.llm.build_trainer_model``:
master weights in its dtype, fake-quantized in its forward when it has a weight format). The
engine's model is the preset built in the rollout dtype holding the trainer's weights, cast to
that dtype by ``load_state_dict_hf`` and then quantized to the rollout format, which is what an
RL weight update delivers (as ``zm parity`` does).

Engine side. The real engine (``zeromismatch.engine.LLM``: scheduler with continuous
batching and chunked prefill, paged block manager, model runner) serves the prompts with
staggered arrivals (one new request per step), so prefills, prefill chunks and decodes of
different requests share forwards as they do in a rollout. Three instance-level substitutions
make it deterministic and attributable, and nothing else is changed (but the engine runs every
step eagerly, ``enforce_eager=True``, so each kernel call is made and seen): the runner's sampler is
replaced by ``ForcedSampler``, which "samples" the given response token and reports its
logprob through ``engine.sampler.token_logprobs`` (the function the real sampler and the
trainer both use; for processed logprobs it is the same ``processed_log_softmax`` + gather
as the real sampler); the runner's ``build_batch`` is wrapped to tell the recorder which
(sequence, position) each row of the step's forward and of its sampled rows is; and its
``compute_logits`` is wrapped so that a head computed outside the KernelSet
(``lm_head_precision="activation"``: a plain torch linear in the activation dtype) is recorded
as that step's ``lm_head`` call (``RecordingKernels.record_outside``). Each request's sampling
seed is its sequence id, which is how the sampler knows which response to force. Prefix caching
is off (a cached prefix would skip computing those rows).

Trainer side. ``train.logprobs.compute_logprobs`` (the trainer's own recompute) in one
packed micro-batch of all sequences, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from ..kernels.base import KernelSet
from ..rl.stacks import numerics_problems
from .compare import bits_equal
from .recorder import OUTSIDE_OPS, CallRecord, Perturbation, RecordingKernels

#: dtype spellings (the short ones are the defaults and what reports print) -> torch dtypes
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "float32": torch.float32, "bfloat16": torch.bfloat16}
#: -> ``rl.stacks`` spelling, which ``numerics_problems`` checks
_STACK_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "float32": "float32", "bfloat16": "bfloat16"}
#: the numerics fields, as ``rl.stacks.NUMERICS_FIELDS`` names them, less the kernel sets
NUMERICS = ("dtype", "quant", "rollout_dtype", "rollout_quant", "kv_cache_dtype", "rollout_lm_head")


@dataclass
class BisectConfig:
    model: str
    # a registered name, or a KernelSet object (e.g. one under development, not registered)
    rollout_kernels: str | KernelSet = "aligned"
    trainer_kernels: str | KernelSet = "aligned"
    seed: int = 0
    num_seqs: int = 3
    max_prompt_len: int = 10
    max_response_len: int = 6
    # both sides' dtype and weight format, unless a rollout_* field overrides the engine's (RLConfig's rule)
    dtype: str = "fp32"
    quant: str = "none"
    rollout_dtype: str | None = None
    rollout_quant: str | None = None
    kv_cache_dtype: str = "auto"  # the engine's: "auto" | "fp8_e4m3"
    rollout_lm_head: str = "fp32"  # the engine's: "fp32" (the kernel set's head) | "activation"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    logprobs_mode: str = "processed"
    prefill_chunk: int | None = 4
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 16
    block_size: int = 4
    perturb: str | None = None

    def validate(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a preset name, got {self.model!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")
        for name in ("dtype", "rollout_dtype"):
            value = getattr(self, name)
            if not (value is None and name == "rollout_dtype") and value not in DTYPES:
                raise ValueError(f"{name} must be one of {sorted(DTYPES)}, got {value!r}")
        numerics = {name: getattr(self, name) for name in NUMERICS}
        numerics.update(dtype=_STACK_DTYPE[self.dtype], rollout_dtype=_STACK_DTYPE.get(self.rollout_dtype))
        for name, why in numerics_problems(numerics):
            raise ValueError(f"{name} {why} (got {getattr(self, name)!r})")
        for name in (
            "num_seqs",
            "max_prompt_len",
            "max_response_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.prefill_chunk is not None and (
            not isinstance(self.prefill_chunk, int) or self.prefill_chunk < 1
        ):
            raise ValueError(f"prefill_chunk must be a positive int or None, got {self.prefill_chunk!r}")
        if self.perturb is not None:
            Perturbation.parse(self.perturb)
        for side in ("rollout_kernels", "trainer_kernels"):
            if not isinstance(getattr(self, side), str | KernelSet):
                raise TypeError(
                    f"{side} must be a kernel set name or a KernelSet, got {getattr(self, side)!r}"
                )

    @property
    def rollout_label(self) -> str:
        return kernels_label(self.rollout_kernels)

    @property
    def trainer_label(self) -> str:
        return kernels_label(self.trainer_kernels)

    @property
    def engine_dtype(self) -> str:
        return self.rollout_dtype or self.dtype

    @property
    def engine_quant(self) -> str:
        return self.rollout_quant or self.quant

    def numerics(self, side: str) -> dict:
        """What ``side`` ("rollout" | "trainer") computes in: kernel set, dtype (torch's name),
        weight format and, for the engine, its KV cache and lm_head."""
        if side == "trainer":
            return {"kernels": self.trainer_label, "dtype": _STACK_DTYPE[self.dtype], "quant": self.quant}
        return {
            "kernels": self.rollout_label,
            "dtype": _STACK_DTYPE[self.engine_dtype],
            "quant": self.engine_quant,
            "kv_cache_dtype": self.kv_cache_dtype,
            "lm_head": self.rollout_lm_head,
        }


def kernels_label(kernels: str | KernelSet) -> str:
    """What a kernel set is called in reports and repro files."""
    return kernels if isinstance(kernels, str) else str(getattr(kernels, "name", type(kernels).__name__))


@dataclass
class SideRun:
    """One side's recorded run: every kernel call and the per-token logprobs it produced."""

    side: str  # "rollout" | "trainer"
    kernels: str
    records: list[CallRecord]
    logprobs: list[torch.Tensor]  # per sequence, fp32 [len(response)]
    forwards: list[dict] = field(default_factory=list)  # per model forward: its composition
    perturbation: dict | None = None
    settings: dict = field(default_factory=dict)  # what the run depends on (``trainer_settings``)


#: the BisectConfig fields a trainer-side run depends on (not the rollout kernels, the engine's
#: batching or the perturbation): a trainer run is reused only under the same values
TRAINER_FIELDS = (
    "model", "seed", "num_seqs", "max_prompt_len", "max_response_len", "dtype", "quant", "temperature",
    "top_k", "top_p", "logprobs_mode",
)  # fmt: skip


def trainer_settings(config) -> dict:
    settings = {name: getattr(config, name) for name in TRAINER_FIELDS}
    return {"trainer_kernels": config.trainer_label, **settings}


def make_sequences(
    seed: int, num_seqs: int, vocab_size: int, max_prompt_len: int, max_response_len: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Deterministic (prompt, response) token lists; responses have >= 2 tokens when allowed,
    so every sequence has at least one decode step."""
    gen = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    low_response = min(2, max_response_len)
    for _ in range(num_seqs):
        prompt_len = int(torch.randint(1, max_prompt_len + 1, (1,), generator=gen))
        response_len = int(torch.randint(low_response, max_response_len + 1, (1,), generator=gen))
        prompts.append(torch.randint(0, vocab_size, (prompt_len,), generator=gen).tolist())
        responses.append(torch.randint(0, vocab_size, (response_len,), generator=gen).tolist())
    return prompts, responses


def sampling_params(config: BisectConfig, seq_id: int, response_len: int):
    from ..engine import SamplingParams

    return SamplingParams(
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        max_tokens=response_len,
        seed=seq_id,
        logprobs_mode=config.logprobs_mode,
    )


def build_trainer_side_model(config: BisectConfig):
    """The learner's model: the trainer's dtype, fake-quantized to its format (``zm parity``'s)."""
    from ..engine.llm import build_trainer_model

    return build_trainer_model(
        config.model, config.trainer_kernels, DTYPES[config.dtype], config.seed, config.quant
    )


def build_engine_side_model(config: BisectConfig, weights: dict[str, torch.Tensor]):
    """The engine's model: the preset in the rollout dtype holding ``weights`` (the trainer's HF
    state dict), cast by ``load_state_dict_hf`` and quantized to the rollout format."""
    from ..engine.llm import build_preset
    from ..models import quantize_model

    model = build_preset(config.model, config.rollout_kernels, DTYPES[config.engine_dtype], config.seed, None)
    model.load_state_dict_hf(weights)
    if config.engine_quant != "none":
        quantize_model(model, config.engine_quant)
    return model


class ForcedSampler:
    """Stands in for ``engine.sampler.Sampler``: returns the given response token of each row's
    request (identified by its seed = sequence id) and that token's logprob."""

    def __init__(self, kernels, responses: list[list[int]]):
        self.kernels = kernels
        self.responses = responses

    def __call__(self, logits, params, seeds, token_indices):
        from ..engine.sampler import SamplerOutput, token_logprobs

        tokens = [self.responses[seed][index] for seed, index in zip(seeds, token_indices)]
        token_tensor = torch.tensor(tokens, dtype=torch.int64, device=logits.device)
        chosen = token_logprobs(self.kernels, logits, list(params), token_tensor)
        return SamplerOutput(tokens, [float(x) for x in chosen.cpu()])


def run_rollout_side(config: BisectConfig, prompts, responses, params, weights) -> SideRun:
    from ..engine import LLM

    recorder = RecordingKernels(config.rollout_kernels, perturb=config.perturb)
    model = build_engine_side_model(config, weights)
    total_blocks = sum(-(-(len(p) + len(r)) // config.block_size) for p, r in zip(prompts, responses))
    llm = LLM(
        model,
        recorder,
        dtype=DTYPES[config.engine_dtype],
        kv_cache_dtype=config.kv_cache_dtype,
        lm_head_precision=config.rollout_lm_head,
        seed=config.seed,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        prefill_chunk=config.prefill_chunk,
        enable_prefix_caching=False,
        block_size=config.block_size,
        num_blocks=total_blocks + 1,
        # every step eager: the recorder must see each kernel call of each step, and the forced
        # sampler must draw each token (a step graph replays its calls and samples inside itself)
        enforce_eager=True,
    )
    runner = llm.runner
    runner.sampler = ForcedSampler(recorder, responses)
    original_build = runner.build_batch
    forwards: list[dict] = []

    def build_batch(chunks):
        batch = original_build(chunks)
        rows, head = [], []
        for chunk in chunks:
            seq = chunk.request.seed
            rows.extend((seq, p) for p in range(chunk.start, chunk.start + chunk.num_tokens))
            if chunk.samples:
                head.append((seq, chunk.start + chunk.num_tokens - 1))
        if len(rows) != batch.input_ids.numel():
            raise RuntimeError(
                f"bisect: the runner's batch has {batch.input_ids.numel()} rows but its chunks cover "
                f"{len(rows)} tokens; the engine's batch layout changed and driver.py must follow it"
            )
        recorder.expect_rows(rows, head or None)
        forwards.append(
            {
                "chunks": [
                    {"seq": c.request.seed, "start": c.start, "tokens": c.num_tokens, "samples": c.samples}
                    for c in chunks
                ],
                "tokens": len(rows),
            }
        )
        return batch

    runner.build_batch = build_batch
    original_logits = runner.compute_logits

    def compute_logits(hidden):
        before = len(recorder.records)
        logits = original_logits(hidden)
        if any(r.op == "lm_head" for r in recorder.records[before:]):
            return logits  # the kernel set's head: recorded as it ran
        if runner.lm_head_precision != "activation":
            raise RuntimeError(
                f"bisect: the runner computed logits without kernels.lm_head under lm_head_precision="
                f"{runner.lm_head_precision!r}; driver.py knows only the 'activation' head"
            )
        args = {"hidden": hidden, "weight": model.lm_head_weight}
        # the recorder (and the repro) replays this head with its own copy of the runner's computation:
        # a runner that computes it otherwise must fail here, not leave a repro of something else
        if not bits_equal(OUTSIDE_OPS["activation-lm-head"][1](**args), logits):
            raise RuntimeError(
                "bisect: the runner's activation-dtype head no longer computes what recorder.OUTSIDE_OPS "
                "replays (engine/runner.py ModelRunner.compute_logits); update the recorder"
            )
        return recorder.record_outside("activation-lm-head", args, logits)

    runner.compute_logits = compute_logits
    outputs: dict[int, object] = {}
    pending = list(range(len(prompts)))  # request i arrives at step i
    step = 0
    limit = sum(len(p) + len(r) for p, r in zip(prompts, responses)) + len(prompts) + 8
    with recorder.attach(model):
        while pending or llm.has_unfinished():
            while pending and pending[0] <= step:
                i = pending.pop(0)
                llm.add_request(prompts[i], params[i], request_id=str(i))
            for out in llm.step():
                if out.finished:
                    outputs[int(out.request_id)] = out
            step += 1
            if step > limit:
                raise RuntimeError(
                    f"bisect: the engine did not finish {len(prompts)} requests in {limit} steps"
                )
    logprobs = []
    for i, response in enumerate(responses):
        out = outputs[i]
        if list(out.token_ids) != list(response):
            raise RuntimeError(
                f"bisect: the engine returned tokens {out.token_ids} for sequence {i}, "
                f"not the forced {response}"
            )
        logprobs.append(torch.tensor(out.logprobs, dtype=torch.float32))
    perturbation = recorder.perturbation
    if perturbation is not None and perturbation.applied_to is None:
        raise ValueError(f"--perturb {config.perturb}: {_no_such_call(recorder.records, perturbation)}")
    return SideRun(
        "rollout",
        config.rollout_label,
        recorder.records,
        logprobs,
        forwards,
        None if perturbation is None else perturbation.applied_to,
    )


def run_trainer_side(config: BisectConfig, prompts, responses, params, model) -> SideRun:
    from ..train.logprobs import compute_logprobs

    recorder = RecordingKernels(config.trainer_kernels)
    forward_rows, head_rows = [], []
    for seq, (prompt, response) in enumerate(zip(prompts, responses)):
        length = len(prompt) + len(response) - 1
        forward_rows.extend((seq, p) for p in range(length))
        head_rows.extend((seq, p) for p in range(len(prompt) - 1, length))
    recorder.expect_rows(forward_rows, head_rows)
    with recorder.attach(model):
        logprobs = compute_logprobs(model, prompts, responses, params, kernels=recorder)
    forwards = [
        {
            "chunks": [
                {"seq": s, "start": 0, "tokens": len(p) + len(r) - 1, "samples": True}
                for s, (p, r) in enumerate(zip(prompts, responses))
            ],
            "tokens": len(forward_rows),
        }
    ]
    return SideRun(
        "trainer",
        config.trainer_label,
        recorder.records,
        [lp.detach() for lp in logprobs],
        forwards,
        settings=trainer_settings(config),
    )


def _no_such_call(records: list[CallRecord], perturbation: Perturbation) -> str:
    from .recorder import canonical_op

    layers = sorted({str(r.layer) for r in records if canonical_op(r.op) == canonical_op(perturbation.op)})
    if not layers:
        ops = sorted({canonical_op(r.op) for r in records})
        return f"this model never calls {perturbation.op}; it calls: {', '.join(ops)}"
    return (
        f"{perturbation.op} is never called at layer {perturbation.layer}; "
        f"it is called at: {', '.join(layers)}"
    )


def run_sides(
    config: BisectConfig, trainer: SideRun | None = None
) -> tuple[SideRun, SideRun, list[list[int]], list[list[int]]]:
    """Validate, draw the tokens, run both sides. Returns (rollout, trainer, prompts, responses).

    ``trainer``: a trainer-side run of the same model, seed, sizes and trainer kernels to reuse
    (it does not depend on the rollout kernels or the perturbation)."""
    config.validate()
    from ..kernels import get_kernels

    get_kernels(config.rollout_kernels)  # unknown names fail here with the list of sets
    get_kernels(config.trainer_kernels)
    from ..models import resolve_config

    vocab = int(resolve_config(config.model).vocab_size)
    prompts, responses = make_sequences(
        config.seed, config.num_seqs, vocab, config.max_prompt_len, config.max_response_len
    )
    params = [sampling_params(config, i, len(r)) for i, r in enumerate(responses)]
    # built even when a trainer run is reused: the engine takes its weights from it
    trainer_model = build_trainer_side_model(config)
    rollout = run_rollout_side(config, prompts, responses, params, trainer_model.state_dict_hf())
    if trainer is None:
        trainer = run_trainer_side(config, prompts, responses, params, trainer_model)
    elif trainer.settings != trainer_settings(config) or [len(lp) for lp in trainer.logprobs] != [
        len(r) for r in responses
    ]:
        wanted = trainer_settings(config)
        other = {k: (trainer.settings.get(k), v) for k, v in wanted.items() if trainer.settings.get(k) != v}
        raise ValueError(
            "run_sides(trainer=...) got a trainer run made under other settings or tokens "
            f"(setting: (that run's, this config's) = {other})"
        )
    return rollout, trainer, prompts, responses


def config_dict(config: BisectConfig) -> dict:
    out = {f.name: getattr(config, f.name) for f in fields(config)}
    out["rollout_kernels"], out["trainer_kernels"] = config.rollout_label, config.trainer_label
    return out
