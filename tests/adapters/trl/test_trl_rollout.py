"""EnvRolloutFunc without a trainer: prompts map to their tasks, episodes are token-exact, env tokens are masked."""

from __future__ import annotations

import json

import pytest

from gym_llm_adapters.engines import HFEngine, SamplingConfig
from gym_llm_adapters.trl import EnvRolloutFunc, PromptIndex, env_dataset, trl_fields

from trl_cases import TASK, TOOL_ENV, check_trl_fields

SAMPLING = SamplingConfig(max_tokens=24)


@pytest.fixture(scope="module")
def taught_engine(taught_model_path):
    return HFEngine(taught_model_path, logprobs_mode="processed")


def test_tool_episodes_are_token_exact_and_env_tokens_masked(gsm8k_test_file, taught_engine):
    data = str(gsm8k_test_file)
    dataset = env_dataset("LLMPythonTool-v0", data_files=data, **TOOL_ENV).filter(
        lambda row: row["task_id"] in (TASK, 462))
    prompts = [row["prompt"] for row in dataset for _ in range(4)]  # TRL's layout: each prompt 4 times in a row
    with EnvRolloutFunc("LLMPythonTool-v0", data_files=data, **TOOL_ENV) as rollout:
        trajectories = rollout.rollout(prompts, taught_engine, SAMPLING, group_size=4, seed=0, max_seq_len=512)
        fields = trl_fields(trajectories)
        assert [t.task_id for t in trajectories] == [row["task_id"] for row in dataset for _ in range(4)]
        assert [t.group_id for t in trajectories] == [0] * 4 + [1] * 4 and {t.round for t in trajectories} == {0}
        masked = check_trl_fields(fields, trajectories, taught_engine.tokenizer)
        taught = [t for t in trajectories if t.task_id == TASK]
        assert masked > 0 and all(json.loads(t.steps[0].info["tool_calls"])[0]["status"] == "ok" for t in taught)
        assert {t.reward for t in taught} <= {0.0, 1.0} and all(t.steps[-1].info["correct"] == t.reward for t in taught)
        conversation = json.loads(taught[0].steps[-1].info["messages"])
        assert [m["role"] for m in conversation] == ["system", "user", "assistant", "tool", "assistant"]
        assert conversation[3]["content"].strip() == "4"
        # a second call is the next round; the same seed gives the same episodes
        again = rollout.rollout(prompts, taught_engine, SAMPLING, group_size=4, seed=0)
        assert {t.round for t in again} == {1} and rollout.calls == 2
        assert [t.token_ids.tolist() for t in again] == [t.token_ids.tolist() for t in trajectories]


def test_prompt_index(gsm8k_test_file):
    import gymnasium as gym

    from gym_llm_adapters.trl.dataset import chat_common

    env = gym.make("LLMGSM8K-v0", data_files=str(gsm8k_test_file), system_prompt="Be exact.")
    tasks = env.unwrapped.parts.tasks
    index = PromptIndex(chat_common(env), tasks)
    row = env_dataset("LLMGSM8K-v0", data_files=str(gsm8k_test_file), system_prompt="Be exact.", num_rows=1)[0]
    assert index.task_id(row["prompt"]) == row["task_id"]
    question = tasks[TASK].prompt
    assert index.task_id(question) == TASK  # a plain-text prompt: the task's question
    assert index.task_id([{"role": "system", "content": "Other."}, {"role": "user", "content": question}]) == TASK
    with pytest.raises(ValueError, match="not one of the env's 1319 tasks.*same env arguments"):
        index.task_id([{"role": "user", "content": "What is 2 + 2?"}])
    with pytest.raises(TypeError, match="text-only prompts"):
        index.task_id([{"role": "user", "content": [{"type": "image"}]}])


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="text"), r"sets \['mode'\] itself"),
    (dict(vocab_size=64, record_messages=False), r"sets \[.record_messages., .vocab_size.\] itself"),
    (dict(seed="yes"), "seed must be 'trainer', an int or None"),
    (dict(max_tokens_per_turn=0), "max_tokens_per_turn must be an int >= 1"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EnvRolloutFunc("LLMGSM8K-v0", **kwargs)
