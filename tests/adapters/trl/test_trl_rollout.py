"""EnvRolloutFunc without a trainer: prompts map to their tasks, episodes are token-exact, env tokens are masked."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gym_llm_adapters.engines import HFEngine, SamplingConfig
from gym_llm_adapters.trl import EnvRolloutFunc, PromptIndex, env_dataset, trl_fields
from gym_llm_adapters.types import Trajectory

from trl_cases import TASK, TOOL_ENV

SAMPLING = SamplingConfig(max_tokens=24)


def env_spans(trajectory: Trajectory) -> list[tuple[int, int]]:
    """``[start, stop)`` of the tokens the env appended between turns, read off the observations: turn ``k+1``'s
    observation is turn ``k``'s observation + its sampled ids + what the env added."""
    spans = []
    for before, after in zip(trajectory.steps, trajectory.steps[1:]):
        start = len(before.prompt_ids) + len(before.completion_ids)
        assert after.prompt_ids[:start].tolist() == before.prompt_ids.tolist() + before.completion_ids.tolist()
        spans.append((start, len(after.prompt_ids)))
    return spans


def check_trl_fields(fields: dict, trajectories: list[Trajectory], tokenizer) -> int:
    """The TRL fields are the trajectories, token-exact, with ``env_mask == 0`` exactly on env tokens; returns how
    many env tokens were masked."""
    masked = 0
    for i, t in enumerate(trajectories):
        P = len(t.steps[0].prompt_ids)
        last = t.steps[-1]
        full = last.prompt_ids.tolist() + last.completion_ids.tolist()  # what the env saw, in the end
        assert fields["prompt_ids"][i] == full[:P] and fields["prompt_ids"][i] + fields["completion_ids"][i] == full
        expected_mask = np.ones(len(full) - P, dtype=int)
        for start, stop in env_spans(t):
            expected_mask[start - P: stop - P] = 0
            masked += stop - start
            env_text = tokenizer.decode(full[start:stop])
            assert env_text.startswith("\n<|im_start|>tool\n") and env_text.endswith("<|im_start|>assistant\n")
        assert fields["env_mask"][i] == expected_mask.tolist()
        sampled = np.concatenate([s.logprobs for s in t.steps]).tolist()
        logprobs = np.asarray(fields["logprobs"][i])
        assert logprobs[expected_mask == 1].tolist() == sampled and (logprobs[expected_mask == 0] == 0).all()
        assert fields["env_reward"][i] == sum(s.reward for s in t.steps) and fields["num_turns"][i] == len(t.steps)
    return masked


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

    from gym_llm_adapters.trl.dataset import chat_core

    env = gym.make("LLMGSM8K-v0", data_files=str(gsm8k_test_file), system_prompt="Be exact.")
    tasks = env.unwrapped.core.tasks
    index = PromptIndex(chat_core(env), tasks)
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
