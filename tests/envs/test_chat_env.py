"""LLMChat-v0: prompt sources, follow-ups, user simulator, reward hook."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import gym_llm  # noqa: F401
from gym_llm.core.messages import Message


def test_defaults_use_builtin_prompts():
    env = gym.make("LLMChat-v0")
    assert len(env.unwrapped.parts.tasks) == 24
    obs, info = env.reset(seed=0)
    assert obs.startswith("<|im_start|>user\n") and obs.endswith("<|im_start|>assistant\n")


def test_scripted_follow_ups_then_termination():
    env = gym.make("LLMChat-v0", prompts=[{"prompt": "Hi", "follow_ups": ["And?", "Bye."]}], max_turns=5)
    env.reset(seed=0)
    out = [env.step(f"reply {i}") for i in range(3)]
    assert [o[2] for o in out] == [False, False, True]
    assert "And?" in out[0][0] and "Bye." in out[1][0]
    assert [m.role for m in env.unwrapped.episode.messages] == ["user", "assistant"] * 3


def test_max_turns_truncates():
    env = gym.make("LLMChat-v0", prompts=["Hi"], follow_ups=["More."] * 10, max_turns=2)
    env.reset(seed=0)
    assert env.step("a")[2:4] == (False, False)
    assert env.step("b")[2:4] == (False, True)


def test_user_simulator_and_reward_fn():
    calls = []

    def simulator(messages, task):
        calls.append(messages[-1].content)
        return None if len(messages) >= 4 else f"You said {messages[-1].content!r}."

    def reward_fn(task, messages):
        assert isinstance(messages[-1], Message) and messages[-1].role == "assistant"
        return len(messages[-1].content), {"length": len(messages[-1].content)}

    env = gym.make("LLMChat-v0", prompts=["Hi"], user_simulator=simulator, reward_fn=reward_fn)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("hello")
    assert reward == 5.0 and info["length"] == 5 and not terminated and "You said 'hello'." in obs
    _, reward, terminated, _, _ = env.step("ok")
    assert reward == 2.0 and terminated and calls == ["hello", "ok"]


def test_prompt_sources(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"P{i}"}) for i in range(3)) + "\n")
    assert len(gym.make("LLMChat-v0", prompts=path).unwrapped.parts.tasks) == 3
    import datasets

    ds = datasets.Dataset.from_list([{"messages": [{"role": "user", "content": "from a dataset"}]}])
    env = gym.make("LLMChat-v0", prompts=ds)
    obs, _ = env.reset(seed=0)
    assert "from a dataset" in obs


@pytest.mark.parametrize("kwargs,error,match", [
    ({"reward_fn": 3}, TypeError, "reward_fn must be callable"),
    ({"user_simulator": "x"}, TypeError, "user_simulator must be callable"),
    ({"follow_ups": "x"}, TypeError, "follow_ups must be a list"),
    ({"prompts": [{"text": "x"}]}, ValueError, "none of the prompt keys"),
    ({"mode": "tokens"}, ValueError, "needs a tokenizer"),
    ({"max_turns": 0}, ValueError, "max_turns must be an int >= 1"),
    ({"mode": "sound"}, ValueError, "mode must be 'text' or 'tokens'"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        gym.make("LLMChat-v0", **kwargs)


def test_bad_simulator_output_raises_without_changing_state():
    env = gym.make("LLMChat-v0", prompts=["Hi"], user_simulator=lambda m, t: 42)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="must return a str or None"):
        env.step("hello")
    assert len(env.unwrapped.episode.messages) == 1


def test_record_messages_puts_the_conversation_in_the_last_info():
    env = gym.make("LLMChat-v0", prompts=[{"prompt": "Hi!", "follow_ups": ["More?"]}], system_prompt="Be brief.",
                   max_turns=3, record_messages=True)
    env.reset(seed=0)
    _, _, terminated, _, info = env.step("Hello.")
    assert not terminated and "messages" not in info
    _, _, terminated, _, info = env.step("That is all.")
    assert terminated
    assert json.loads(info["messages"]) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "More?"},
        {"role": "assistant", "content": "That is all."}]
    env = gym.make("LLMChat-v0", prompts=["Hi!"], max_turns=1)  # off by default
    env.reset(seed=0)
    assert "messages" not in env.step("x")[-1]
