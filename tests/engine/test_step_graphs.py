"""Step graphs (kernels/capture/, engine/step_graphs.py): a replayed decode step gives the eager
engine's bits, the trainer still recomputes them bitwise, and what a replay cannot repeat refuses
the capture instead of being replayed as a constant."""

import gc
import threading
import warnings
import weakref

import pytest
import torch

from zeromismatch.engine import LLM, SamplingParams, step_graphs
from zeromismatch.engine.llm import build_preset
from zeromismatch.engine.step_graphs import padded_width
from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.aligned import gemm
from zeromismatch.kernels.capture.record_replay import Guard, ReplayDiverged, capture, host_reads_for_checks
from zeromismatch.train.logprobs import recompute_outputs

NATIVE = "aligned-native"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _prompts(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (int(torch.randint(2, 14, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(n)]  # fmt: skip


#: the sampler runs inside the graph (processed logprobs, temperature 0 or >= 1) or after it
GRAPH_SAMPLES = dict(temperature=1.0, top_k=40, top_p=0.9)


def _generate(model, kernels=NATIVE, enforce_eager=False, seed=0, dtype=torch.float32, **sampling):
    """Requests of different lengths that leave at different steps, so the decode batch shrinks
    (several graph keys) and stays the same for runs of steps (replays)."""
    llm = LLM(model, kernels, dtype=dtype, max_num_seqs=6, block_size=4, enforce_eager=enforce_eager)
    lengths = (9, 12, 15, 18, 21, 24)
    sampling = sampling or dict(temperature=0.9, top_p=0.95)
    params = [SamplingParams(**sampling, max_tokens=m, seed=seed) for m in lengths]
    outputs = llm.generate(_prompts(6, seed), params)
    assert all(o.finish_reason == "length" for o in outputs)
    return llm, outputs


def _tokens_and_logprobs(outputs):
    return [o.token_ids for o in outputs], torch.cat([torch.tensor(o.logprobs) for o in outputs])


CASES = [
    pytest.param("tiny-qwen3", "fp32", None, id="qwen3-fp32"),
    pytest.param("tiny-qwen3", "bf16", None, id="qwen3-bf16"),
    pytest.param("tiny-qwen3-moe", "fp32", None, id="moe-fp32"),
    pytest.param("tiny-deepseek-v3", "bf16", "fp8", id="deepseek-bf16-fp8", marks=pytest.mark.slow),
    pytest.param("tiny-qwen3", "bf16", "nvfp4", id="qwen3-bf16-nvfp4", marks=pytest.mark.slow),
    pytest.param("tiny-deepseek-v3", "fp32", None, id="deepseek-fp32", marks=pytest.mark.slow),
    pytest.param("tiny-nemotron-h", "fp32", None, id="nemotron-fp32"),
    pytest.param("tiny-nemotron-h", "bf16", "nvfp4", id="nemotron-bf16-nvfp4", marks=pytest.mark.slow),
]


# every model case with the sampler in the graph; the other samplings on tiny-qwen3 (the sampler
# does not depend on the model)
SAMPLINGS = [
    pytest.param(dict(temperature=0.9, top_p=0.95), False, id="eager-sampler"),
    pytest.param(dict(temperature=0.0), True, id="greedy"),
    pytest.param(dict(temperature=1.0, logprobs_mode="raw"), False, id="raw-logprobs"),
]
GRID = [
    pytest.param(*case.values, GRAPH_SAMPLES, True, id=f"{case.id}-graph-samples", marks=case.marks)
    for case in CASES
] + [pytest.param("tiny-qwen3", "fp32", None, *s.values, id=f"qwen3-fp32-{s.id}") for s in SAMPLINGS]


@pytest.mark.native
@pytest.mark.parametrize("preset, dtype, quant, sampling, graph_samples", GRID)
def test_replayed_steps_give_the_eager_engines_bits_and_the_trainers(
    preset, dtype, quant, sampling, graph_samples
):
    model = build_preset(preset, NATIVE, DTYPES[dtype], 0, quant)
    graphed, outputs = _generate(model, dtype=DTYPES[dtype], **sampling)
    stats = graphed.runner.graphs.stats()
    # not vacuous: decode steps were captured and replayed, under more than one key
    assert stats["enabled"] and stats["captures"] >= 2 and stats["replays"] >= 5, stats
    sampled_in_graph = {entry.step.tokens is not None for entry in graphed.runner.graphs.graphs.values()}
    assert sampled_in_graph == {graph_samples}
    eager, eager_outputs = _generate(model, enforce_eager=True, dtype=DTYPES[dtype], **sampling)
    assert eager.runner.graphs.stats()["replays"] == 0
    tokens, logprobs = _tokens_and_logprobs(outputs)
    eager_tokens, eager_logprobs = _tokens_and_logprobs(eager_outputs)
    assert tokens == eager_tokens
    assert torch.equal(logprobs, eager_logprobs)
    trainer = torch.cat(recompute_outputs(model, outputs))
    assert torch.equal(trainer, logprobs)
    if sampling["temperature"] > 0:  # (greedy rows report logprob 0)
        assert not (logprobs == 0).all()


@pytest.mark.parametrize("kernels", ["default", "aligned"])
def test_kernel_sets_that_read_lengths_on_the_host_refuse_capture_and_run_eagerly(kernels):
    """The inverse: these sets' attention reads sequence lengths with tolist(), which a replay would
    repeat as constants; capture refuses, names the place, and the engine runs eagerly (its
    tokens are those of enforce_eager)."""
    model = build_preset("tiny-qwen3", kernels, torch.float32, 0)
    llm, outputs = _generate(model, kernels)
    stats = llm.runner.graphs.stats()
    assert not stats["enabled"] and stats["replays"] == 0
    assert stats["disabled_reason"].startswith("capture refused:") and ".py:" in stats["disabled_reason"]
    _, eager_outputs = _generate(model, kernels, enforce_eager=True)
    assert _tokens_and_logprobs(outputs)[0] == _tokens_and_logprobs(eager_outputs)[0]


@pytest.mark.native
def test_an_in_place_weight_change_drops_the_graphs():
    model = build_preset("tiny-qwen3", NATIVE, torch.float32, 0)
    llm, _ = _generate(model)
    captures = llm.runner.graphs.captures
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    changed = llm.generate(_prompts(6, 1), [SamplingParams(temperature=0.9, max_tokens=12, seed=1)] * 6)
    assert llm.runner.graphs.captures > captures  # recaptured under the new weights
    fresh = LLM(model, NATIVE, max_num_seqs=6, block_size=4, enforce_eager=True)
    expected = fresh.generate(_prompts(6, 1), [SamplingParams(temperature=0.9, max_tokens=12, seed=1)] * 6)
    assert _tokens_and_logprobs(changed)[0] == _tokens_and_logprobs(expected)[0]
    assert torch.equal(_tokens_and_logprobs(changed)[1], _tokens_and_logprobs(expected)[1])


@pytest.mark.native
def test_update_weights_keep_mode_recomputes_each_version_with_graphs_on():
    model = build_preset("tiny-qwen3", NATIVE, torch.float32, 0)
    llm = LLM(model, NATIVE, max_num_seqs=4, block_size=4)
    ids = [llm.add_request(p, SamplingParams(temperature=0.9, max_tokens=20, seed=3)) for p in _prompts(4, 2)]
    for _ in range(10):
        llm.step()
    assert llm.runner.graphs.replays > 0
    new_weights = build_preset("tiny-qwen3", NATIVE, torch.float32, 7).state_dict_hf()
    old_weights = model.state_dict_hf()
    llm.update_weights(new_weights, mode="keep")
    outputs = {}
    while llm.has_unfinished():
        outputs.update((o.request_id, o) for o in llm.step() if o.finished)
    outputs = [outputs[i] for i in ids]
    versions = {v for o in outputs for v in o.weight_versions}
    assert versions == {0, 1}
    # each version's tokens recompute bitwise under that version's weights
    for version, weights in ((0, old_weights), (1, new_weights)):
        reference = build_preset("tiny-qwen3", NATIVE, torch.float32, 0)
        reference.load_state_dict_hf(weights)
        recomputed = recompute_outputs(reference, outputs)
        for o, lp in zip(outputs, recomputed):
            mask = torch.tensor([v == version for v in o.weight_versions])
            assert torch.equal(lp[mask], torch.tensor(o.logprobs)[mask])


def test_enforce_eager_must_be_a_bool():
    with pytest.raises(TypeError, match="enforce_eager must be a bool"):
        LLM("tiny-qwen3", "default", enforce_eager="yes")


def test_padded_width_doubles_from_sixteen():
    assert [padded_width(n) for n in (1, 16, 17, 32, 33)] == [16, 16, 32, 32, 64]


# ---- the capture itself ----------------------------------------------------------------------------


@pytest.mark.native
def test_a_replay_on_new_inputs_equals_the_eager_call_on_them():
    kernels = get_kernels(NATIVE)
    weight = torch.randn(48)
    x = torch.randn(5, 48)

    def step():
        return kernels.rms_norm(x, weight, 1e-6) + x * 2

    with torch.no_grad():
        graph, out = capture(step, held=[x, weight])  # (read by the native call without an aten op)
        # the add of the two runs natively too (capture/ops_as_native_calls.py); x * 2 stays a torch op
        assert graph.refused is None and graph.native_call_names() == ["zm_rms_norm", "zm_add_f32"]
        fresh = torch.randn(5, 48)
        x.copy_(fresh)
        graph.replay()
        assert torch.equal(out, kernels.rms_norm(fresh, weight, 1e-6) + fresh * 2)


@pytest.mark.parametrize(
    "read, what",
    [
        (lambda x: x.sum().item(), "_local_scalar_dense"),
        (lambda x: int(x[0] > 0), "_local_scalar_dense"),
        (lambda x: x.tolist(), "tolist"),
        (lambda x: torch.tensor([1.0, 2.0]), "lift_fresh"),
        (lambda x: torch.rand(3), "rand"),
        (lambda x: x[x > 0], "index"),
    ],
    ids=["item", "int", "tolist", "tensor-from-list", "random", "boolean-mask"],
)
def test_what_a_replay_cannot_repeat_refuses_the_capture(read, what):
    x = torch.randn(4)
    with torch.no_grad():
        graph, _ = capture(lambda: read(x))
    assert graph.refused is not None and what in graph.refused


def test_reads_marked_as_checks_are_accepted_and_not_replayed():
    x = torch.randn(4)

    def step():
        with host_reads_for_checks():
            if bool((x.abs() > 100).any()) or len(x.tolist()) != 4:
                raise ValueError("bad x")
        return x * 3

    with torch.no_grad():
        graph, out = capture(step)
        assert graph.refused is None and len(graph) == 1  # only the multiply
        x.fill_(1000.0)  # the check would raise now; a replay does not repeat it
        graph.replay()
    assert torch.equal(out, torch.full((4,), 3000.0))


def test_capture_needs_no_grad():
    with pytest.raises(RuntimeError, match="no_grad"):
        capture(lambda: None)


def test_the_guard_sees_in_place_changes_and_replaced_parameters():
    layer = torch.nn.Linear(3, 3)
    guard = Guard(layer)
    assert guard.holds()
    with torch.no_grad():
        layer.bias.add_(1)
    assert not guard.holds()
    guard = Guard(layer)
    layer.weight = torch.nn.Parameter(layer.weight.detach().clone())
    assert not guard.holds()


@pytest.mark.native
def test_a_native_status_that_changes_at_replay_raises_replay_diverged():
    """zm_attention checks every block id it reads: a table that was valid at capture and is not
    at replay changes its status, so the step is rerun eagerly (which raises the proper error)."""
    kernels = get_kernels(NATIVE)
    k_cache, v_cache = torch.randn(4, 2, 1, 8), torch.randn(4, 2, 1, 8)
    q = torch.randn(1, 2, 8)
    table = torch.tensor([[0, 1]])
    cu, kv_lens = torch.tensor([0, 1]), torch.tensor([3])
    with torch.no_grad():
        attend = lambda: kernels.paged_attention(q, k_cache, v_cache, table, cu, kv_lens, 0.5)  # noqa: E731
        graph, _ = capture(attend, held=[q, k_cache, v_cache, table, cu, kv_lens])
        assert graph.refused is None
        table[0, 1] = 99  # outside the cache's 4 blocks
        with pytest.raises(ReplayDiverged, match="zm_attention"):
            graph.replay()


@pytest.mark.native
def test_an_activation_dtype_lm_head_is_replayed_too():
    """S2 fix 4's stock head (a GEMM in the activation dtype, upcast after) inside the graph."""
    model = build_preset("tiny-qwen3", NATIVE, torch.bfloat16, 0)
    results = []
    for enforce_eager in (False, True):
        llm = LLM(model, NATIVE, dtype=torch.bfloat16, max_num_seqs=4, block_size=4,
                  lm_head_precision="activation", enforce_eager=enforce_eager)  # fmt: skip
        outputs = llm.generate(_prompts(4, 5), SamplingParams(**GRAPH_SAMPLES, max_tokens=10, seed=2))
        results.append(_tokens_and_logprobs(outputs))
        if not enforce_eager:
            assert llm.runner.graphs.replays > 0
            assert all(entry.step.tokens is not None for entry in llm.runner.graphs.graphs.values())
    assert results[0][0] == results[1][0] and torch.equal(results[0][1], results[1][1])


@pytest.mark.native
@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-nemotron-h"])
def test_a_diverged_replay_reruns_eagerly_unless_recurrent_state_was_updated(preset):
    """A replay whose native call returns another status than at capture (made so here by editing the
    status the graph expects of its first native call) gives up that graph's key. A transformer's
    step reruns eagerly and the generate ends as an eager engine's would; a hybrid's Mamba2 state
    was already updated by the partial replay, so its step's requests end with the error instead."""
    from zeromismatch.kernels.capture.record_replay import _call_native

    model = build_preset(preset, NATIVE, torch.float32, 0)
    params = SamplingParams(**GRAPH_SAMPLES, max_tokens=10, seed=4)
    llm = LLM(model, NATIVE, max_num_seqs=4, block_size=4)
    ids = [llm.add_request(p, params) for p in _prompts(4, 6)]
    while not llm.runner.graphs.graphs:
        llm.step()
    entry = next(iter(llm.runner.graphs.graphs.values()))
    index = next(i for i, (call, _) in enumerate(entry.graph.records) if call is _call_native)
    function, args, status, name = entry.graph.records[index][1]
    entry.graph.records[index] = (_call_native, (function, args, "another status", name))
    finished = {}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        while llm.has_unfinished():
            finished.update((o.request_id, o) for o in llm.step() if o.finished)
    stats = llm.runner.graphs.stats()
    assert stats["enabled"] and any("at capture" in why for why in stats["keys_given_up"].values())
    outputs = [finished[i] for i in ids]
    if preset == "tiny-qwen3":
        expected = LLM(model, NATIVE, max_num_seqs=4, block_size=4, enforce_eager=True).generate(
            _prompts(4, 6), params
        )
        assert _tokens_and_logprobs(outputs)[0] == _tokens_and_logprobs(expected)[0]
    else:
        assert all(o.finish_reason == "error" and "diverged" in o.error for o in outputs)


def _rollout_with_edit(model, edit, enforce_eager, steps_before=8):
    """4 requests, ``edit(model)`` after ``steps_before`` steps, then to the end: every output."""
    llm = LLM(model, NATIVE, max_num_seqs=4, block_size=4, enforce_eager=enforce_eager)
    ids = [llm.add_request(p, SamplingParams(**GRAPH_SAMPLES, max_tokens=24, seed=1)) for p in _prompts(4, 1)]
    finished = {}
    for _ in range(steps_before):
        finished.update((o.request_id, o) for o in llm.step() if o.finished)
    edit(model)
    while llm.has_unfinished():
        finished.update((o.request_id, o) for o in llm.step() if o.finished)
    if not enforce_eager:
        assert llm.runner.graphs.replays > 0
    return _tokens_and_logprobs([finished[i] for i in ids])


def _clear_and_churn(model):
    gemm.clear_packed_weights()  # frees the packed panels the graph's native calls read...
    return [torch.full((65536,), 7.0) for _ in range(64)]  # ...and reuses their memory


def _assign_data(model):
    weight = model.model.layers[0].mlp.down_proj.weight
    weight.data = weight.data * 1.5  # what Module.to / _apply do: same object, new storage


def _write_through_data(model):
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.data.mul_(1.5)  # bypasses the version counter...
    gemm.clear_packed_weights()  # ...so the documented remedy


def _scale_quantized(model):
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.qweight.scales.mul_(2)


@pytest.mark.native
@pytest.mark.parametrize(
    "edit, quant",
    [(_clear_and_churn, None), (_assign_data, None), (_write_through_data, None), (_scale_quantized, "fp8")],
    ids=["cleared-cache", "data-assigned", "data-written", "quantized-scales"],
)
def test_weight_and_cache_changes_the_eager_engine_sees_the_graphs_see(edit, quant):
    """Found in review: a graph read packed weights by address without holding them (use after
    free once the cache dropped them), and its guard missed ``.data`` changes and quantized
    weights. Each edit here changes what an eager engine computes (or frees what a graph read)."""
    dtype = torch.bfloat16 if quant else torch.float32
    graphed = _rollout_with_edit(build_preset("tiny-qwen3", NATIVE, dtype, 0, quant), edit, False)
    eager = _rollout_with_edit(build_preset("tiny-qwen3", NATIVE, dtype, 0, quant), edit, True)
    assert graphed[0] == eager[0] and torch.equal(graphed[1], eager[1])


@pytest.mark.native
def test_a_native_call_on_memory_the_capture_does_not_hold_refuses_it():
    """A pointer into a tensor that reached the native call without an aten op (so the graph does not
    keep it) would be read after it may be freed: the capture refuses, unless the caller holds it."""
    kernels = get_kernels(NATIVE)
    weight = torch.randn(48)
    x = torch.randn(5, 48)
    with torch.no_grad():
        graph, _ = capture(lambda: kernels.rms_norm(x, weight, 1e-6))
        assert "no tensor the capture kept holds" in graph.refused
        graph, _ = capture(lambda: kernels.rms_norm(x, weight, 1e-6), held=[weight])
        assert graph.refused is None


@pytest.mark.native
def test_another_threads_native_calls_are_not_recorded():
    kernels = get_kernels(NATIVE)
    weight, x = torch.randn(48), torch.randn(5, 48)
    stop = threading.Event()

    def busy():
        other = torch.randn(3, 48)
        while not stop.is_set():
            kernels.rms_norm(other, weight, 1e-6)

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        with torch.no_grad():
            counts = [capture(lambda: kernels.rms_norm(x, weight, 1e-6), held=[weight])[0].num_native_calls
                      for _ in range(20)]  # fmt: skip
    finally:
        stop.set()
        thread.join()
    assert counts == [1] * 20


@pytest.mark.native
def test_an_engine_and_its_graphs_are_freed_with_it():
    """Found in review: the process's first capture imported torch._dynamo while Tensor.tolist was
    patched, and dynamo kept the patched function, which held that graph (and so the KV cache)."""
    model = build_preset("tiny-qwen3", NATIVE, torch.float32, 0)
    llm, _ = _generate(model, **GRAPH_SAMPLES)
    assert llm.runner.graphs.replays > 0
    cache = weakref.ref(llm.runner.cache.k_cache[0])
    del llm
    gc.collect()
    assert cache() is None
    assert torch.Tensor.tolist is torch._C.TensorBase.tolist


@pytest.mark.native
def test_rows_with_different_sampling_parameters_share_a_forward_only_graph():
    model = build_preset("tiny-qwen3", NATIVE, torch.float32, 0)
    llm = LLM(model, NATIVE, max_num_seqs=4, block_size=4)
    params = [SamplingParams(temperature=t, max_tokens=12, seed=3) for t in (1.0, 1.5, 1.0, 2.0)]
    graphed = llm.generate(_prompts(4, 3), params)
    assert llm.runner.graphs.replays > 0
    assert all(entry.step.tokens is None for entry in llm.runner.graphs.graphs.values())
    eager = LLM(model, NATIVE, max_num_seqs=4, block_size=4, enforce_eager=True).generate(
        _prompts(4, 3), params
    )
    assert _tokens_and_logprobs(graphed)[0] == _tokens_and_logprobs(eager)[0]


@pytest.mark.native
def test_a_graph_over_the_memory_limit_is_not_kept(monkeypatch):
    monkeypatch.setattr(step_graphs, "MAX_GRAPH_BYTES", 1000)
    model = build_preset("tiny-qwen3", NATIVE, torch.float32, 0)
    llm, _ = _generate(model, **GRAPH_SAMPLES)
    stats = llm.runner.graphs.stats()
    assert stats["replays"] == 0 and stats["captures"] >= 1 and stats["graphs"] == 0
    assert all("limit 1000" in why for why in stats["keys_given_up"].values())


@pytest.mark.native
def test_graphs_go_off_when_the_weights_change_before_any_replay():
    """An RL loop with short rollouts and an update per step only pays for captures (found running
    the DeepSeek mini's aligned-native arm: its rollouts got slower)."""
    model = build_preset("tiny-qwen3", NATIVE, torch.float32, 0)
    llm = LLM(model, NATIVE, max_num_seqs=4, block_size=4)
    weights = model.state_dict_hf()
    for round_ in range(step_graphs.MAX_FRUITLESS_ROUNDS + 1):
        # (two tokens: the prefill samples one, the one decode step is captured, none replays)
        llm.generate(_prompts(4, round_), SamplingParams(**GRAPH_SAMPLES, max_tokens=2, seed=round_))
        llm.update_weights(weights)  # copied in place: every graph is stale
    stats = llm.runner.graphs.stats()
    assert stats["replays"] == 0 and stats["captures"] == step_graphs.MAX_FRUITLESS_ROUNDS
    assert not stats["enabled"] and "before any graph was replayed" in stats["disabled_reason"]
    # a round with a replay starts the count again
    llm = LLM(model, NATIVE, max_num_seqs=4, block_size=4)
    for round_ in range(step_graphs.MAX_FRUITLESS_ROUNDS + 1):
        llm.generate(
            _prompts(4, round_), SamplingParams(**GRAPH_SAMPLES, max_tokens=2 + 3 * (round_ % 2), seed=1)
        )
        llm.update_weights(weights)
    assert llm.runner.graphs.stats()["enabled"] and llm.runner.graphs.replays > 0
