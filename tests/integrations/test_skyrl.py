"""gym_llm envs through SkyRL-gym's own registry and make(), driven the way SkyRL's generator drives an env: the
conversation it builds (init's messages + each reply + each step's observations) is the gym_llm episode's, message
for message, with the same rewards."""

from __future__ import annotations

import gymnasium as gym
import pytest
import skyrl_gym

from gym_llm.integrations.skyrl import PREFIX, SkyRLEnv, register, skyrl_dataset

ARITH = {"source": "arithmetic"}


@pytest.fixture(scope="module", autouse=True)
def registered():
    return register()


def skyrl_rollout(env, policy, prompt=None) -> tuple[list[dict], list[float], dict]:
    """SkyRL's generator loop: the chat history grows by the reply and the env's new messages until done."""
    history, _ = env.init(prompt)
    rewards = []
    while True:
        reply = policy(history)
        history = history + [{"role": "assistant", "content": reply}]
        out = env.step(reply)
        history = history + out["observations"]
        rewards.append(out["reward"])
        if out["done"]:
            return history, rewards, out["metadata"]


def native_rollout(env_id, kwargs, task_id, policy) -> tuple[list[dict], list[float]]:
    env = gym.make(env_id, **kwargs)
    env.reset(options={"task_id": task_id})
    rewards, done = [], False
    while not done:
        history = [m.to_dict() for m in env.unwrapped.episode.messages]
        _, reward, terminated, truncated, _ = env.step(policy(history))
        rewards.append(float(reward))
        done = terminated or truncated
    messages = [m.to_dict() for m in env.unwrapped.episode.messages]
    env.close()
    return messages, rewards


def sum_policy(history) -> str:
    a, b = (int(x) for x in history[-1]["content"].split("What is ")[1].split("?")[0].split(" + "))
    return f"{a} + {b} = {a + b}\n#### {a + b}"


def test_every_gym_llm_id_is_in_skyrls_registry(registered):
    import gym_llm

    assert registered == [PREFIX + info.id for info in gym_llm.ENVS]
    assert set(registered) <= set(skyrl_gym.envs.registration.registry)
    assert register() == registered  # idempotent


def test_single_turn_gsm8k_matches_the_native_env():
    rows = skyrl_dataset("LLMGSM8K-v0", [0, 1, 2], ARITH)
    assert [r["env_class"] for r in rows] == ["gym_llm/LLMGSM8K-v0"] * 3
    for row in rows:
        env = skyrl_gym.make(row["env_class"], env_config={"env_kwargs": ARITH}, extras=row)
        history, rewards, metadata = skyrl_rollout(env, sum_policy, row["prompt"])
        env.close()
        assert history[:-1] == row["prompt"]  # init returns what the dataset shows
        assert (history, rewards) == native_rollout("LLMGSM8K-v0", ARITH, row["task_id"], sum_policy)
        assert rewards == [1.0] and metadata["correct"] is True and metadata["task_id"] == row["task_id"]


def test_multi_turn_chat_and_python_tool_conversations_are_the_native_ones(gsm8k_test_file):
    def chat_policy(history):
        return f"Reply number {sum(m['role'] == 'assistant' for m in history) + 1}."

    env = skyrl_gym.make("gym_llm/LLMChat-v0", env_config={}, extras={"task_id": 0})
    history, rewards, _ = skyrl_rollout(env, chat_policy)
    env.close()
    assert (history, rewards) == native_rollout("LLMChat-v0", {}, 0, chat_policy)
    assert sum(m["role"] == "user" for m in history) >= 2  # the scripted user's next turns came back as observations

    tool_kwargs = {"data_files": str(gsm8k_test_file), "sandbox": {"min_idle": 0, "timeout_s": 10.0}}

    def tool_policy(history):
        if history[-1]["role"] == "tool":
            return f"The tool printed it.\n#### {history[-1]['content'].strip()}"
        return "Let me compute.\n```python\nprint(6 * 7)\n```"

    env = skyrl_gym.make("gym_llm/LLMPythonTool-v0", env_config={"env_kwargs": tool_kwargs}, extras={"task_id": 3})
    history, rewards, _ = skyrl_rollout(env, tool_policy)
    env.close()
    assert [m["role"] for m in history[-3:]] == ["assistant", "tool", "assistant"]
    assert history[-2]["content"] == "42\n"  # the sandbox ran the call; its output is SkyRL's observation
    native, native_rewards = native_rollout("LLMPythonTool-v0", tool_kwargs, 3, tool_policy)
    assert (history, rewards) == (native, native_rewards)


def test_envs_are_pooled_per_configuration():
    first = skyrl_gym.make("gym_llm/LLMGSM8K-v0", env_config={"env_kwargs": ARITH}, extras={"task_id": 0})
    second = skyrl_gym.make("gym_llm/LLMGSM8K-v0", env_config={"env_kwargs": ARITH}, extras={"task_id": 1})
    assert first.env is not second.env  # two live trajectories never share an episode
    inner = first.env
    first.close()
    first.close()  # idempotent: the env goes back once
    third = skyrl_gym.make("gym_llm/LLMGSM8K-v0", env_config={"env_kwargs": ARITH}, extras={"task_id": 2})
    assert third.env is inner
    assert third.init(None)[1]["task_id"] == 2
    other = skyrl_gym.make("gym_llm/LLMGSM8K-v0", env_config={"env_kwargs": {**ARITH, "max_operand": 20}})
    assert other.env is not inner
    for env in (second, third, other):
        env.close()


def test_bad_configuration_says_what_to_pass():
    with pytest.raises(ValueError, match="env_id"):
        SkyRLEnv({})
    with pytest.raises(ValueError, match="SkyRL speaks text"):
        SkyRLEnv({"env_id": "LLMGSM8K-v0", "env_kwargs": {"mode": "tokens"}})
    with pytest.raises(TypeError, match=r"extras\['task_id'\] must be an int"):
        SkyRLEnv({"env_id": "LLMGSM8K-v0", "env_kwargs": ARITH}, extras={"task_id": "3"})
    env = SkyRLEnv({"env_id": "LLMGSM8K-v0", "env_kwargs": ARITH}, extras={"task_id": 0})
    env.init(None)
    with pytest.raises(TypeError, match="reply text"):
        env.step(["not", "text"])
    env.close()


def test_the_integration_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, gym_llm.integrations.skyrl; print([m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers', 'vllm')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"



def test_arguments_without_a_stable_text_form_are_not_pooled():
    """A function (or a tokenizer) in env_kwargs has no stable text form: the env is closed with its SkyRLEnv instead
    of pooled under a key no later configuration could match."""
    from gym_llm.integrations import skyrl

    config = {"env_id": "LLMChat-v0", "env_kwargs": {"reward_fn": lambda task, messages: 1.0}}
    env = SkyRLEnv(config, extras={"task_id": 0})
    assert env._pool_key is None
    env.init(None)
    assert env.step("Hello.")["reward"] in (0.0, 1.0)
    env.close()
    assert all(env.env not in idle for idle in skyrl._pool.values())
    assert skyrl._key("LLMGSM8K-v0", ARITH) == skyrl._key("LLMGSM8K-v0", dict(ARITH))
