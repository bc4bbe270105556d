"""The runner's batch construction and ``generate``'s output handling (no numerics involved)."""

import torch
from toy_model import ToyKernels, ToyModel

from zeromismatch.engine import LLM, SamplingParams
from zeromismatch.engine.request import Request
from zeromismatch.engine.runner import ModelRunner, _token_slice
from zeromismatch.engine.scheduler import ScheduledChunk


def _request(prompt, output, blocks):
    request = Request("r", list(prompt), SamplingParams(), seed=0, arrival=0)
    request.output_token_ids = list(output)
    request.block_ids = list(blocks)
    return request


def test_token_slice_equals_slicing_all_token_ids():
    request = _request([1, 2, 3, 4], [5, 6, 7], [])
    for start in range(8):
        for end in range(start, 8):
            assert _token_slice(request, start, end) == request.all_token_ids[start:end]


def test_build_batch_layout():
    runner = ModelRunner(ToyModel(), ToyKernels(), num_blocks=8, block_size=2, max_num_seqs=2)
    decode = _request([1, 2, 3], [4], [5, 1])  # 4 tokens, computing the last one
    prefill = _request([7, 8, 9], [], [6, 0])  # a chunk of 2 from position 1
    batch = runner.build_batch([ScheduledChunk(decode, 3, 1), ScheduledChunk(prefill, 1, 2)])
    assert batch.input_ids.tolist() == [4, 8, 9]
    assert batch.positions.tolist() == [3, 1, 2]
    assert batch.cu_seqlens_q.tolist() == [0, 1, 3]
    assert batch.kv_lens.tolist() == [4, 3]
    assert batch.block_table.tolist() == [[5, 1], [6, 0]]
    # slot = block_ids[p // 2] * 2 + p % 2
    assert batch.slot_mapping.tolist() == [1 * 2 + 1, 6 * 2 + 1, 0 * 2 + 0]
    # (the model derives has_initial_state where it keeps recurrent state: kv_lens - q_lens > 0)
    assert batch.has_initial_state is None and (batch.kv_lens - batch.q_lens > 0).tolist() == [True, True]
    assert batch.block_table.dtype == torch.int64 and batch.block_table.shape == (2, 2)


def test_generate_keeps_pending_abort_outputs_for_the_next_step():
    llm = LLM(ToyModel(), ToyKernels(), max_num_seqs=2, block_size=4)
    llm.add_request([1, 2, 3], SamplingParams(max_tokens=5, seed=1))
    llm.step()
    aborted = llm.update_weights(llm.model.state_dict_hf(), mode="abort")  # (an empty update is refused)
    assert len(aborted) == 1 and aborted[0].aborted
    out = llm.generate([[4, 5]], SamplingParams(max_tokens=2, seed=2))
    assert len(out[0].token_ids) == 2
    # the abort outputs are still delivered by the next step(), as its docstring promises
    delivered = llm.step()
    assert [o.request_id for o in delivered] == [aborted[0].request_id]
