"""LLMGSM8K-v0: data sources, prompt formatting, rewards, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gymnasium as gym
import pytest

import gym_llm  # noqa: F401


def test_quickstart_from_local_file(gsm8k_test_file):
    env = gym.make("LLMGSM8K-v0", data_files=str(gsm8k_test_file))
    obs, info = env.reset(seed=0)
    task = env.unwrapped.episode.task
    assert task.data["question"] in obs and "#### <number>" in obs
    obs, reward, terminated, truncated, info = env.step(f"Reasoning... so the total is {task.answer}.\n#### {task.answer}")
    assert reward == 1.0 and terminated and not truncated
    assert info["correct"] and info["formatted"] and info["extracted_answer"] == task.answer
    assert info["reference_answer"] == task.answer


def test_format_reward_and_wrong_answers(gsm8k_test_file):
    env = gym.make("LLMGSM8K-v0", data_files=gsm8k_test_file, format_reward=0.1)
    env.reset(seed=0, options={"task_id": 0})
    assert env.unwrapped.episode.task.answer == "18"
    assert env.step("#### 18")[1] == pytest.approx(1.1)
    env.reset(options={"task_id": 0})
    assert env.step("The answer is 18.")[1] == pytest.approx(1.0)
    env.reset(options={"task_id": 0})
    assert env.step("#### 17")[1] == pytest.approx(0.1)
    env.reset(options={"task_id": 0})
    _, reward, _, _, info = env.step("I am not sure.")
    assert reward == 0.0 and info["extracted_answer"] == ""


def test_records_prompt_template_and_system_prompt():
    env = gym.make("LLMGSM8K-v0", tasks=[{"question": "What is 2+3?", "answer": "#### 5"}],
                   prompt_template="Q: {question}\nA:", system_prompt="You are a calculator.")
    obs, _ = env.reset(seed=0)
    assert "Q: What is 2+3?\nA:" in obs and "You are a calculator." in obs
    assert env.step("5")[1] == 1.0


def test_gsm_symbolic_source_generates_offline():
    env = gym.make("LLMGSM8K-v0", source="gsm_symbolic", num_generated=20, generator_seed=3)
    obs, _ = env.reset(seed=0)
    task = env.unwrapped.episode.task
    assert len(env.unwrapped.parts.tasks) == 20 and task.answer
    assert env.step(f"#### {task.answer}")[1] == 1.0


def test_arithmetic_source_generates_scorable_problems_with_worked_answers():
    env = gym.make("LLMGSM8K-v0", source="arithmetic", num_generated=50, generator_seed=1, max_operand=4)
    tasks = env.unwrapped.parts.tasks
    assert len(tasks) == 50
    for task in tasks:
        a, b = (int(x) for x in task.data["question"].removeprefix("What is ").removesuffix("?").split(" + "))
        assert 0 <= a <= 4 and 0 <= b <= 4 and task.answer == str(a + b)
    env.reset(seed=0)
    task = env.unwrapped.episode.task
    assert env.step(task.data["answer"])[1] == 1.0  # the worked answer is a correct reply (an SFT target)
    env.reset()
    assert env.step(f"#### {int(env.unwrapped.episode.task.answer) + 1}")[1] == 0.0
    with pytest.raises(ValueError, match="max_operand must be an int >= 1"):
        gym.make("LLMGSM8K-v0", source="arithmetic", max_operand=0)


def _operands(env) -> set[tuple[int, int]]:
    return {tuple(int(x) for x in t.data["question"].removeprefix("What is ").removesuffix("?").split(" + "))
            for t in env.unwrapped.parts.tasks}


def test_arithmetic_train_and_test_pairs_never_share_a_problem():
    """A held-out evaluation: problems drawn from the "test" pairs (any generator seed) are never training problems
    (any seed), and the two parts cover every pair once."""
    train = _operands(gym.make("LLMGSM8K-v0", source="arithmetic", max_operand=99, operand_pairs="train",
                               num_generated=20_000, generator_seed=0))
    test = _operands(gym.make("LLMGSM8K-v0", source="arithmetic", max_operand=99, operand_pairs="test",
                              num_generated=5_000, generator_seed=1))
    assert not train & test
    assert len(test) > 1_500 and len(train) > 7_000  # of 2,000 and 8,000 pairs: the draws reach nearly all of them
    every = {(a, b) for a in range(100) for b in range(100)}
    assert train <= every and test <= every
    # the partition is fixed by max_operand alone: another seed draws from the same 2,000 test pairs
    again = _operands(gym.make("LLMGSM8K-v0", source="arithmetic", max_operand=99, operand_pairs="test",
                               num_generated=5_000, generator_seed=7))
    assert not again & train
    with pytest.raises(ValueError, match="operand_pairs must be 'all', 'train' or 'test'"):
        gym.make("LLMGSM8K-v0", source="arithmetic", operand_pairs="eval")


def test_unreachable_hub_error_lists_the_three_options():
    code = "import gymnasium as gym, gym_llm\ngym.make('LLMGSM8K-v0')"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0
    for option in ("data_files=", "huggingface.co", "source='gsm_symbolic'"):
        assert option in out.stderr


def test_bad_files_and_records(tmp_path):
    with pytest.raises(FileNotFoundError, match="Task file not found"):
        gym.make("LLMGSM8K-v0", data_files=tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "1"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        gym.make("LLMGSM8K-v0", data_files=bad)
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"problem": "q", "solution": "1"}) + "\n")
    with pytest.raises(ValueError, match="needs 'question' and 'answer'"):
        gym.make("LLMGSM8K-v0", data_files=wrong)
    with pytest.raises(ValueError, match="must contain '\\{question\\}'"):
        gym.make("LLMGSM8K-v0", data_files=wrong, prompt_template="no placeholder")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="holds no records"):
        gym.make("LLMGSM8K-v0", data_files=empty)


def test_a_directory_as_data_files_says_it_is_one_and_what_to_pass(tmp_path):
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    with pytest.raises(FileNotFoundError, match="is a directory, not a task file") as excinfo:
        gym.make("LLMGSM8K-v0", data_files=folder)
    assert "not found" not in str(excinfo.value) and repr(f"{folder}/<name>.jsonl") in str(excinfo.value)
    (folder / "test.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "#### 2"}) + "\n")
    (folder / "notes.txt").write_text("not a task file")
    expected = r"\(it holds test\.jsonl\)\. Pass the path of a \.jsonl file in it"
    with pytest.raises(FileNotFoundError, match=expected) as excinfo:
        gym.make("LLMGSM8K-v0", data_files=str(folder))
    assert f"e.g. {str(folder / 'test.jsonl')!r}" in str(excinfo.value)
    env = gym.make("LLMGSM8K-v0", data_files=folder / "test.jsonl")  # the file the message names works
    assert len(env.unwrapped.parts.tasks) == 1
    parts = tmp_path / "parts.parquet"
    parts.mkdir()
    with pytest.raises(FileNotFoundError, match=r"is a directory, not a task file\. Pass the path of a \.parquet"):
        gym.make("LLMGSM8K-v0", data_files=parts)


def test_datasets_dataset_source(gsm8k_test_file):
    import datasets

    ds = datasets.load_dataset("json", data_files=str(gsm8k_test_file), split="train")
    env = gym.make("LLMGSM8K-v0", tasks=ds)
    assert len(env.unwrapped.parts.tasks) == 1319
    env.reset(seed=0)
    assert env.step(f"#### {env.unwrapped.episode.task.answer}")[1] == 1.0


def test_a_sign_off_with_numbers_is_paid_and_a_correction_is_not(gsm8k_test_file):
    """Issue 45: a correct '#### N' followed by a friendly sentence with another number earned nothing."""
    env = gym.make("LLMGSM8K-v0", data_files=str(gsm8k_test_file))
    env.reset(seed=0, options={"task_id": 0})
    answer = env.unwrapped.episode.task.answer
    _, reward, _, _, info = env.step(f"She makes 9 * 2 = {answer} dollars.\n#### {answer}\n\n"
                                     "Let me know if you need help with the other 2 questions!")
    assert reward == 1.0 and info["correct"], info
    env.reset(options={"task_id": 0})
    _, reward, _, _, info = env.step(f"#### {answer}\nActually, 19.")
    assert reward == 0.0 and "correction" in info["answer_problem"], info
    env.close()
