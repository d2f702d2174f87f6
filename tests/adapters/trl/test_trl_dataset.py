"""env_dataset: rows are the env's own episodes (order, prompts, metadata) on the real GSM8K and IFEval data."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import gym_llm  # noqa: F401
from gym_llm.envs.gsm8k import DEFAULT_GSM8K_PROMPT
from gym_llm.envs.python_tool import DEFAULT_PYTHON_TOOL_SYSTEM_PROMPT
from gym_llm.rewards.gsm8k import reference_answer
from gym_llm.tasks.loading import read_jsonl
from gym_llm_adapters.trl import env_dataset


def test_gsm8k_rows_are_the_env_episodes_in_order(gsm8k_test_file):
    records = read_jsonl(gsm8k_test_file)
    dataset = env_dataset("LLMGSM8K-v0", data_files=str(gsm8k_test_file), num_rows=30, seed=3)
    assert dataset.column_names == ["prompt", "task_id", "seed", "round", "answer"] and len(dataset) == 30
    env = gym.make("LLMGSM8K-v0", data_files=str(gsm8k_test_file))
    served = [env.reset(seed=3)[1]["task_id"]] + [env.reset()[1]["task_id"] for _ in range(29)]
    assert dataset["task_id"] == served and dataset["round"] == list(range(30)) and set(dataset["seed"]) == {3}
    for row in dataset:
        record = records[row["task_id"]]
        assert row["prompt"] == [{"role": "user", "content": DEFAULT_GSM8K_PROMPT.format(question=record["question"])}]
        assert row["answer"] == reference_answer(record["answer"]) != ""
    assert env_dataset("LLMGSM8K-v0", data_files=str(gsm8k_test_file), num_rows=30, seed=4)["task_id"] != served


def test_ifeval_epoch_holds_every_task_once_with_its_instructions(ifeval_file):
    records = read_jsonl(ifeval_file)
    dataset = env_dataset("LLMIFEval-v0", data_files=str(ifeval_file), seed=0)
    assert len(dataset) == len(records) == 541 and sorted(dataset["task_id"]) == list(range(541))
    for row in dataset.select(range(0, 541, 37)):
        record = records[row["task_id"]]
        assert row["prompt"] == [{"role": "user", "content": record["prompt"]}] and row["answer"] == ""
        assert row["instruction_id_list"] == record["instruction_id_list"]
        expected = [{k: v for k, v in kw.items() if v is not None} for kw in record["kwargs"]]
        assert json.loads(row["instruction_kwargs"]) == expected


def test_system_prompt_and_extra_columns(gsm8k_test_file):
    dataset = env_dataset("LLMPythonTool-v0", data_files=str(gsm8k_test_file), num_rows=3,
                          extra_columns=lambda task: {"question_chars": len(task.data["question"])},
                          sandbox={"timeout_s": 5.0})
    for row in dataset:
        assert row["prompt"][0] == {"role": "system", "content": DEFAULT_PYTHON_TOOL_SYSTEM_PROMPT}
        assert row["prompt"][1]["role"] == "user" and row["question_chars"] > 10


@pytest.mark.parametrize("call, error, match", [
    (lambda f: env_dataset("LLMTokens-v0", prompts=[[1, 2]], vocab_size=8), TypeError, "needs a gym_llm chat env"),
    (lambda f: env_dataset("LLMGSM8K-v0", data_files=f, num_rows=0), ValueError, "num_rows must be an int >= 1"),
    (lambda f: env_dataset("LLMGSM8K-v0", data_files=f, num_rows=1, extra_columns=lambda t: {"answer": 1}),
     ValueError, r"reserved column\(s\) \['answer'\]"),
])
def test_bad_input(gsm8k_test_file, call, error, match):
    with pytest.raises(error, match=match):
        call(str(gsm8k_test_file))
