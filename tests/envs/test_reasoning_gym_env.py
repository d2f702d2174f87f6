"""LLMReasoningGym-v0: reasoning-gym's datasets through the env, scored by each dataset's own ``score_answer``.
(check_env, vector parity and groups: tests/envs/test_all_envs.py, through the registry; every dataset's scorer on
its own references: scripts/reasoning_gym_scorers.py, whose last run docs/reasoning_gym.md records.)"""

from __future__ import annotations

import gymnasium as gym
import pytest

import gym_llm  # noqa: F401
from gym_llm.envs.reasoning_gym import dataset_names, load_reasoning_gym_tasks

# a spread of kinds, each fast to generate: arithmetic, algebra, strings, logic, graphs, games, codes
SAMPLE = ["basic_arithmetic", "chain_sum", "gcd", "simple_equations", "letter_counting", "spell_backward",
          "caesar_cipher", "number_sorting", "family_relationships", "shortest_path", "maze", "mini_sudoku",
          "tower_of_hanoi", "countdown", "base_conversion", "syllogism"]
NO_REFERENCE = ["boxnet", "graph_color", "propositional_logic", "rush_hour"]  # the dataset checks validity instead


def test_every_dataset_is_listed_and_gym_llm_list_shows_them(capsys):
    names = dataset_names()
    assert len(names) >= 100 and set(SAMPLE + NO_REFERENCE) <= set(names)
    from gym_llm_adapters.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert f"{len(names)} datasets: " in out and "zebra_puzzles" in out


@pytest.mark.parametrize("dataset", SAMPLE)
def test_the_datasets_own_reference_answer_scores_one_and_a_wrong_one_does_not(dataset):
    env = gym.make("LLMReasoningGym-v0", dataset=dataset, size=4, seed=3, task_order="sequential")
    for task_id in range(4):
        env.reset(options={"task_id": task_id})
        task = env.unwrapped.episode.task
        assert task.data["entry"]["question"] in task.prompt
        _, reward, terminated, _, info = env.step(f"thinking...\n<answer>{task.answer}</answer>")
        assert (reward, terminated, info["correct"], info["score"]) == (1.0, True, True, 1.0), (dataset, task.answer)
        env.reset(options={"task_id": task_id})
        _, reward, _, _, info = env.step("<answer>certainly not the answer ###</answer>")
        assert reward < 1.0 and not info["correct"]
    env.close()


@pytest.mark.parametrize("dataset", NO_REFERENCE)
def test_datasets_without_a_single_reference_have_none(dataset):
    tasks = load_reasoning_gym_tasks(dataset, size=2, seed=0)
    assert all(task.answer is None for task in tasks)


def test_difficulty_settings_pass_through_and_seeds_give_distinct_problem_sets():
    easy = load_reasoning_gym_tasks("basic_arithmetic", config={"min_terms": 2, "max_terms": 2}, size=30, seed=0)
    hard = load_reasoning_gym_tasks("basic_arithmetic", config={"min_terms": 6, "max_terms": 6}, size=30, seed=0)
    operators = lambda task: sum(task.data["entry"]["question"].count(op) for op in " + - * / ".split())  # noqa: E731
    assert max(map(operators, easy)) < min(map(operators, hard))
    # reasoning-gym draws problem i from seed + i: seeds 0 and 1 share 199 of 200 problems (the trap the docs warn
    # of); seeds further apart than the size give separate streams (equal only where the problem space is small)
    prompts = lambda seed: [t.prompt for t in load_reasoning_gym_tasks("chain_sum", size=200, seed=seed)]  # noqa
    assert prompts(0)[1:] == prompts(1)[:-1]
    train, held_out = set(prompts(0)), set(prompts(1_000_000))
    assert len(train & held_out) < 40


def test_bad_names_and_settings_say_what_to_do():
    with pytest.raises(ValueError, match=r"no dataset 'chain_sums'; did you mean \['chain_sum'"):
        gym.make("LLMReasoningGym-v0", dataset="chain_sums")
    with pytest.raises(ValueError, match="refused the settings"):
        gym.make("LLMReasoningGym-v0", dataset="basic_arithmetic", config={"min_terms": 5, "max_terms": 2})
    env = gym.make("LLMReasoningGym-v0", size=3)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("I believe it is 7")  # no tag, no Answer: line
    assert reward == 0.0 and not info["formatted"] and "no <answer>" in info["answer_problem"]
    env.close()


@pytest.mark.parametrize(("dataset", "config", "steps"), [
    ("chain_sum", {"min_terms": 2, "max_terms": 6, "min_digits": 1, "max_digits": 4}, True),
    ("chain_sum", {"min_terms": 3, "max_terms": 3, "min_digits": 2, "max_digits": 2, "allow_negation": True}, True),
    ("leg_counting", {"min_animals": 1, "max_animals": 5, "max_instances": 15}, True),
    ("gcd", {}, False),
])
def test_worked_solutions_are_scored_correct_and_show_their_steps(dataset, config, steps):
    """What an SFT warm start trains on (the `solution` of each task) is a reply the env pays 1 for; chain_sum's and
    leg_counting's carry one operation per line, re-computed here from the question itself."""
    import re

    env = gym.make("LLMReasoningGym-v0", dataset=dataset, config=config, size=40, seed=3)
    try:
        tasks = env.unwrapped.parts.tasks
        for index, task in enumerate(tasks):
            solution = task.data["solution"]
            env.reset(options={"task_id": index})
            _, reward, *_ = env.step(solution)
            assert reward == 1.0, (task.messages[-1].content, solution)
            lines = solution.splitlines()
            assert lines[-1] == f"<answer>{task.answer}</answer>"
            assert (len(lines) > 1) == steps
            for line in lines[:-1]:  # each step's arithmetic holds
                left, right = line.rsplit("=", 1)
                left = left.split(":")[-1].replace("x", "*")
                assert re.fullmatch(r"[-+*\d\s]+", left) and eval(left) == int(right), line  # digits and + - * only
    finally:
        env.close()


def test_a_decorated_number_is_read_and_an_alternative_is_refused():
    env = gym.make("LLMReasoningGym-v0", dataset="chain_sum", size=2, seed=3)
    env.reset(seed=0, options={"task_id": 0})
    answer = env.unwrapped.episode.task.answer
    _, reward, _, _, info = env.step(f"<answer>**{answer}**.</answer>\nFeel free to ask about problem 2!")
    assert reward == 1.0 and info["correct"], info
    env.reset(options={"task_id": 0})
    _, reward, _, _, info = env.step(f"<answer>{answer}</answer>\nOr maybe 7.")
    assert reward == 0.0 and "alternative" in info["answer_problem"], info
    env.close()
