"""Run the same tokens through the rollout engine (kernel set A) and the trainer (kernel set B),
recording every kernel call on both sides.

Tokens. ``--seed`` draws ``num_seqs`` (prompt, response) pairs of random lengths; both sides
see exactly these tokens (teacher forcing), so every op output row can be matched by its
token identity (sequence id, position).

Engine side. The real engine (``zeromismatch.engine.LLM``: scheduler with continuous
batching and chunked prefill, paged block manager, model runner) serves the prompts with
staggered arrivals (one new request per step), so prefills, prefill chunks and decodes of
different requests share forwards as they do in a rollout. Two instance-level substitutions
make it deterministic and attributable, and nothing else is changed (but the engine runs every
step eagerly, ``enforce_eager=True``, so each kernel call is made and seen): the runner's sampler is
replaced by ``ForcedSampler``, which "samples" the given response token and reports its
logprob through ``engine.sampler.token_logprobs`` (the function the real sampler and the
trainer both use; for processed logprobs it is the same ``processed_log_softmax`` + gather
as the real sampler); and the runner's ``build_batch`` is wrapped to tell the recorder which
(sequence, position) each row of the step's forward and of its sampled rows is. Each
request's sampling seed is its sequence id, which is how the sampler knows which response
to force. Prefix caching is off (a cached prefix would skip computing those rows).

Trainer side. ``train.logprobs.compute_logprobs`` (the trainer's own recompute) in one
packed micro-batch of all sequences, in order.

Both models are built by ``engine.llm.build_preset`` from the same preset, seed, dtype and
quantization, so they hold identical weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from ..kernels.base import KernelSet
from .recorder import CallRecord, Perturbation, RecordingKernels

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
QUANTS = ("none", "fp8", "nvfp4")


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
    dtype: str = "fp32"
    quant: str = "none"
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
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.quant not in QUANTS:
            raise ValueError(f"quant must be one of {QUANTS}, got {self.quant!r}")
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


def build_side_model(config: BisectConfig, kernels: str):
    from ..engine.llm import build_preset

    return build_preset(config.model, kernels, DTYPES[config.dtype], config.seed, config.quant)


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


def run_rollout_side(config: BisectConfig, prompts, responses, params) -> SideRun:
    from ..engine import LLM

    recorder = RecordingKernels(config.rollout_kernels, perturb=config.perturb)
    model = build_side_model(config, config.rollout_kernels)
    total_blocks = sum(-(-(len(p) + len(r)) // config.block_size) for p, r in zip(prompts, responses))
    llm = LLM(
        model,
        recorder,
        dtype=DTYPES[config.dtype],
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


def run_trainer_side(config: BisectConfig, prompts, responses, params) -> SideRun:
    from ..train.logprobs import compute_logprobs

    recorder = RecordingKernels(config.trainer_kernels)
    model = build_side_model(config, config.trainer_kernels)
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
    rollout = run_rollout_side(config, prompts, responses, params)
    if trainer is None:
        trainer = run_trainer_side(config, prompts, responses, params)
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
