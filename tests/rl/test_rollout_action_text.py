"""What the grader sees of a sampled turn: junk tokens stay visible instead of silently vanishing."""

from __future__ import annotations

import pytest

from zeromismatch.envs import default_tokenizer, make_env
from zeromismatch.rl.rollout import _action_text

TOK = default_tokenizer()


def _ids(text: str) -> list[int]:
    return TOK.encode(text)


def test_plain_turn_decodes_to_its_text_and_the_stop_eos_is_not_text():
    assert _action_text([*_ids("<answer>12</answer>"), TOK.eos_id]) == "<answer>12</answer>"


@pytest.mark.parametrize("junk, shown", [(TOK.pad_id, "<pad>"), (TOK.bos_id, "<bos>"), (TOK.sep_id, "<sep>"),
                                         (TOK.vocab_size, "<unk>"), (511, "<unk>")])  # fmt: skip
def test_control_and_unassigned_tokens_stay_visible(junk, shown):
    ids = [*_ids("<answer>1"), junk, *_ids("2</answer>")]
    assert _action_text(ids) == f"<answer>1{shown}2</answer>"


def test_an_answer_with_a_sampled_control_token_inside_is_not_credited():
    env = make_env("arithmetic", max_digits=1)
    seed = next(s for s in range(100) if env.task(s).answer >= 10)  # a two-digit answer to split
    env.reset(seed)
    answer = str(env.current_task.answer)
    clean = _ids(f"<answer>{answer}</answer>")
    assert env.step(_action_text(clean)).reward == 1.0
    env.reset(seed)
    junk = [*_ids(f"<answer>{answer[0]}"), TOK.pad_id, *_ids(f"{answer[1:]}</answer>")]
    # before the fix the <pad> was dropped and this scored 1.0
    assert env.step(_action_text(junk)).reward == 0.0


def test_the_tools_env_can_echo_a_junk_call_back_in_vocabulary():
    env = make_env("tools")
    env.reset(0)
    result = env.step(_action_text([*_ids("<calc>1"), TOK.sep_id, *_ids("+2</calc>")]))
    assert not result.done and result.observation.startswith("<error>")
    TOK.encode(result.observation)  # the observation is appended to the transcript: must encode
