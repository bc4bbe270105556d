"""Desktop env: screen transitions, goal reward, error observations, injected step latency."""

from __future__ import annotations

import time

import pytest

from zeromismatch.envs import DesktopEnv


def _goal(env):
    return env.current_task.answer


def test_reaching_the_goal_earns_one_and_wrong_values_zero():
    env = DesktopEnv()
    env.reset(0)
    goal = _goal(env)
    env.step("<act>open menu</act>")
    env.step(f"<act>select {goal['app']}</act>")
    for field, value in goal["fields"].items():
        env.step(f"<act>type {field}={value}</act>")
    assert env.step("<act>submit</act>").reward == 1.0

    env.reset(0)
    env.step("<act>open menu</act>")
    env.step(f"<act>select {goal['app']}</act>")
    assert env.step("<act>submit</act>").reward == 0.0  # required fields not set


def test_reopening_an_app_resets_its_fields():
    env = DesktopEnv(max_turns=20)
    env.reset(1)
    goal = _goal(env)
    env.step("<act>open menu</act>")
    env.step(f"<act>select {goal['app']}</act>")
    for field, value in goal["fields"].items():
        env.step(f"<act>type {field}={value}</act>")
    env.step("<act>back</act>")
    env.step(f"<act>select {goal['app']}</act>")
    assert env.step("<act>submit</act>").reward == 0.0


def test_unavailable_actions_give_error_observations():
    env = DesktopEnv()
    env.reset(2)
    result = env.step("<act>submit</act>")  # not available on the desktop screen
    assert not result.done and result.observation.startswith("<obs>error: action not available here; desktop")
    env.step("<act>open menu</act>")
    env.step("<act>select settings</act>")
    assert "error: no field color" in env.step("<act>type color=red</act>").observation
    assert "error: invalid value for volume" in env.step("<act>type volume=101</act>").observation


def test_truncation_after_max_turns():
    env = DesktopEnv(max_turns=5)
    env.reset(3)
    actions = ("open menu", "close", "open menu", "close", "open menu")
    results = [env.step(f"<act>{action}</act>") for action in actions]
    assert results[-1].done and results[-1].reward == 0.0 and results[-1].info["truncated"]
    assert not results[-1].solved


def test_every_goal_fits_the_smallest_max_turns():
    # a two-field goal takes five actions; max_turns 4 used to be accepted and left half the tasks unsolvable
    with pytest.raises(ValueError, match="max_turns must be >= 5"):
        DesktopEnv(max_turns=4)
    assert len(DesktopEnv(max_turns=5).demonstrations(50)) == 50


def test_step_latency_is_injected():
    latency = 0.02
    env = DesktopEnv(step_latency_s=latency)
    env.reset(0)
    started = time.perf_counter()
    actions = ("<act>open menu</act>", "<act>close</act>", "<act>open menu</act>")
    results = [env.step(action) for action in actions]
    elapsed = time.perf_counter() - started
    assert elapsed >= 3 * latency
    assert all(result.info["latency_s"] >= latency for result in results)


def test_bad_configuration():
    with pytest.raises(ValueError, match="step_latency_s"):
        DesktopEnv(step_latency_s=-1.0)
    with pytest.raises(ValueError, match="max_turns"):
        DesktopEnv(max_turns=2)


def test_restate_goal_repeats_the_goal_on_app_screens_only():
    plain, restating = DesktopEnv(), DesktopEnv(restate_goal=True)
    for seed in range(20):
        assert plain.reset(seed) == restating.reset(seed)  # same task, same prompt
        goal = restating.current_task.answer
        wanted = " ".join(f"{field}={value}" for field, value in goal["fields"].items())
        for action in restating._demonstrate(restating.current_task):
            shown, restated = plain.step(action), restating.step(action)
            assert shown.reward == restated.reward
            if restated.done:
                assert restated.reward == 1.0
                break
            on_app = restated.info["screen"] == goal["app"]
            assert restated.observation.endswith(f"; goal: {wanted}</obs>\n") == on_app
            assert restated.observation.replace(f"; goal: {wanted}", "") == shown.observation


def test_free_text_values_are_drawn_per_task_and_copying_them_is_rewarded():
    env = DesktopEnv(free_text=True)
    mail_values, drawn = set(), 0
    for seed in range(200):
        env.reset(seed)
        goal = _goal(env)
        for field, value in goal["fields"].items():
            if field in ("to", "subject"):
                assert value.isalpha() and value.islower() and 3 <= len(value) <= 6
                mail_values.add(value)
                drawn += 1
        rewards = [env.step(action).reward for action in env._demonstrate(env.current_task)]
        assert rewards[-1] == 1.0
    assert drawn > 50 and len(mail_values) > 0.9 * drawn  # not a fixed list: almost never repeated


def test_free_text_accepts_any_short_lowercase_word_and_rejects_others():
    env = DesktopEnv(free_text=True)
    seed = next(s for s in range(100) if DesktopEnv(free_text=True).task(s).answer["app"] == "mail")
    env.reset(seed)
    env.step("<act>open menu</act>")
    env.step("<act>select mail</act>")
    assert "error" not in env.step("<act>type to=zzz</act>").observation
    assert "invalid value for to" in env.step("<act>type to=Zed9</act>").observation
    assert "invalid value for subject" in env.step("<act>type subject=abcdefghi</act>").observation
    assert env.step("<act>submit</act>").reward == 0.0  # typed values are not the task's


def test_free_text_off_keeps_the_fixed_value_sets():
    plain = DesktopEnv()
    assert all(plain.reset(seed) == DesktopEnv(free_text=False).reset(seed) for seed in range(20))
