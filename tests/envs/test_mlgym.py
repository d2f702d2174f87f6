"""LLMMLGym-v0 on the five MLGym fixture tasks (``../shared/mlgym``, passed as a user's checkout path).

Each task runs end to end (reset, edits, validate, submit) and its score must equal what the task's own evaluation
script prints for the same submission when run by hand here, outside the env (``subprocess``, the fixture's files).
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from tests.conftest import shared_mlgym_dir


REPO = Path(__file__).resolve().parents[2]
MLGYM = shared_mlgym_dir()


def _example():
    sys.path.insert(0, str(REPO / "examples"))
    spec = importlib.util.spec_from_file_location("mlgym_scripted", REPO / "examples" / "mlgym_scripted.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mlgym_scripted"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()


@pytest.fixture(scope="module")
def sat_data(tmp_path_factory):
    return EXAMPLE.write_3sat_dataset(tmp_path_factory.mktemp("3sat"), num_formulas=20, seed=1)


@pytest.fixture(scope="module")
def env(sat_data):
    import gym_llm  # noqa: F401

    configs = [str(MLGYM / "configs" / "tasks" / f"{name}.yaml") for name in EXAMPLE.TASKS]
    env = gym.make("LLMMLGym-v0", task_config_path=configs, max_turns=8,
                   dataset_paths={"datasets/3SAT.yaml": str(sat_data)})
    yield env
    env.close()


def _by_hand(task: str, workdir: Path, submission: dict[str, str], sat_data: Path, seed: int) -> dict:
    """The task's evaluation script run directly on the fixture's files and the submission; its printed JSON."""
    shutil.copytree(MLGYM / "data" / task, workdir)
    if task == "3SATTime":
        shutil.copytree(sat_data, workdir / "data")
    for name, content in submission.items():
        (workdir / name).write_text(content)
    if task == "titanic":  # evaluate.py's __main__ hard-codes /home/agent/workspace: call its evaluate() instead
        subprocess.run([sys.executable, "train_and_predict.py"], cwd=workdir, check=True, capture_output=True)
        code = ("import runpy; m = runpy.run_path('evaluate.py'); "
                "m['evaluate']('data/ground_truth.csv', 'submission.csv')")
    else:
        code = f"import random, runpy; random.seed({seed}); runpy.run_path('evaluate.py', run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


class SubmitWithoutValidating(EXAMPLE.ScriptedAgent):
    """The example's script with its ``validate`` call replaced by ``submit``."""

    def act(self, observation: str) -> str:
        action = super().act(observation)
        return EXAMPLE.call("submit") if '"validate"' in action else action


# An evaluation of a game task is ~100,000 calls of the submitted strategy across the two sandboxes' bridge (~6
# CPU-s): two of the three game tasks submit without validating first; titanic and battleOfSexes validate.
SUBMIT_ONLY = ("blotto", "prisonersDilemma")


@pytest.mark.parametrize("task", EXAMPLE.TASKS)
def test_task_end_to_end_scores_like_its_own_evaluation_by_hand(env, task, tmp_path, sat_data):
    index = EXAMPLE.TASKS.index(task)
    observation, info = env.reset(seed=0, options={"task_id": index})
    assert "/home/agent/workspace" in observation and "<tools>" in observation or "submit" in observation
    agent = (SubmitWithoutValidating if task in SUBMIT_ONLY else EXAMPLE.ScriptedAgent)(task)
    steps = []
    while True:
        observation, reward, terminated, truncated, info = env.step(agent.act(observation))
        steps.append(info)
        if terminated or truncated:
            break
    assert terminated and not truncated and info["exit_reason"] == "submit"
    assert task in SUBMIT_ONLY or "Your submission scored" in observation.split("validate")[-1] or any(
        "validate" in s.get("tool_calls", "") for s in steps)
    metrics = json.loads(info["metrics"])
    submission = ({"train_and_predict.py": EXAMPLE.TITANIC} if task == "titanic"
                  else {EXAMPLE.SOLUTIONS[task][0]: EXAMPLE.SOLUTIONS[task][1]})
    expected = _by_hand(task, tmp_path / task, submission, sat_data, seed=info["eval_seed"])
    if task == "3SATTime":  # wall-clock Time differs run to run; everything else is exact
        assert {k: v for k, v in metrics.items() if k != "Time"} == {k: v for k, v in expected.items() if k != "Time"}
        assert metrics["Time"] < 5 and expected["Time"] < 5
    else:
        assert metrics == expected
    assert info["passed"] and reward == 1.0  # the scripted policy beats each baseline
    assert info["metric"] == pytest.approx(metrics[info["metric_name"]] if info["metric_name"] in metrics
                                           else metrics[info["metric_name"].lower()])


def test_a_submission_below_the_baseline_fails_the_threshold_and_metric_reward_modes():
    """"Nobody survived" scores below titanic's recorded baseline (accuracy 0.766); the reward modes differ. (A CSV
    task: its evaluation compares two files, where a game task's plays ~100,000 rounds across the bridge.)"""
    import gym_llm  # noqa: F401

    config = str(MLGYM / "configs" / "tasks" / "titanic.yaml")
    rows = (MLGYM / "data" / "titanic" / "data" / "test.csv").read_text().splitlines()[1:]
    nobody = "PassengerId,Survived\n" + "".join(f"{row.split(',', 1)[0]},0\n" for row in rows)
    rewards = {}
    for mode in ("pass_fail", "metric", "improvement"):
        env = gym.make("LLMMLGym-v0", task_config_path=config, reward=mode, max_turns=4)
        try:
            env.reset(seed=0)
            env.step(EXAMPLE.call("create", filename="submission.csv", content=nobody))
            _, rewards[mode], terminated, _, info = env.step(EXAMPLE.call("submit"))
        finally:
            env.close()
        assert terminated and info["evaluation_error"] in (None, ""), info
    assert 0.5 < info["metric"] < info["baseline"] == pytest.approx(0.76555)
    assert rewards["pass_fail"] == 0.0 and not info["passed"]
    assert rewards["metric"] == pytest.approx(info["metric"])
    assert rewards["improvement"] == pytest.approx(info["metric"] - info["baseline"])


def test_an_evaluation_that_cannot_run_here_is_a_reward_error_never_a_score():
    """A grader whose sandbox cannot import the evaluation's packages (``site_packages=False`` stands in for any
    install the sandbox does not reach, as a venv through a symlink once did): a correct submission is not graded as
    failed. The evaluation of the task's own sample submission (the control) fails too, so ``reward_error`` says the
    evaluation cannot run here, ``metric`` is NaN and ``validate`` says it is not the submission's fault. On a
    working grader a broken submission stays the submission's failure (the control passes: no ``reward_error``)."""
    import dataclasses

    import gym_llm  # noqa: F401
    from gym_llm.tools.sandbox.pool import SandboxPool

    config = str(MLGYM / "configs" / "tasks" / "titanic.yaml")
    rows = (MLGYM / "data" / "titanic" / "data" / "test.csv").read_text().splitlines()[1:]
    everyone = "PassengerId,Survived\n" + "".join(f"{row.split(',', 1)[0]},1\n" for row in rows)
    env = gym.make("LLMMLGym-v0", task_config_path=config, max_turns=6)
    handler = env.unwrapped.parts.extra["chat"].handler
    working = handler.grading_pool
    broken = SandboxPool(dataclasses.replace(working.config, site_packages=False), min_idle=0)
    try:
        env.reset(seed=0)  # a working grader: a submission that is not a CSV is the submission's failure
        env.step(EXAMPLE.call("create", filename="submission.csv", content="not a csv"))
        _, reward, terminated, _, info = env.step(EXAMPLE.call("submit"))
        assert terminated and reward == 0.0 and info["evaluation_error"] and "reward_error" not in info, info

        handler.grading_pool = broken
        env.reset(seed=1)
        observation, *_ = env.step(EXAMPLE.call("create", filename="submission.csv", content=everyone) +
                                   EXAMPLE.call("validate"))
        assert "problem of the environment, not of your submission" in observation
        _, reward, terminated, _, info = env.step(EXAMPLE.call("submit"))
        assert terminated and math.isnan(info["metric"]) and not info["passed"]
        assert "cannot run on this host" in info["reward_error"] and "reference submission" in info["reward_error"]
        assert "ModuleNotFoundError" in info["reward_error"]  # what failed, from the control's own output
    finally:
        handler.grading_pool = working
        broken.close()
        env.close()


def _spin_task(root: Path) -> Path:
    """A CSV task (a checkout of one) whose evaluation computes for as long as the submission's one number says."""
    (root / "configs" / "tasks").mkdir(parents=True)
    (root / "data" / "spin").mkdir(parents=True)
    (root / "data" / "spin" / "evaluate.py").write_text(
        "import json, time\nseconds = float(open('/home/agent/workspace/submission.csv').read().split()[-1])\n"
        "end = time.process_time() + seconds\nwhile time.process_time() < end:\n    pass\n"
        "print(json.dumps({'Score': seconds}))\n")
    (root / "data" / "spin" / "sample_submission.csv").write_text("seconds\n0\n")
    config = root / "configs" / "tasks" / "spin.yaml"
    config.write_text("id: spin\nname: Spin\ndescription: Write `submission.csv`.\ntask_entrypoint: CSVSubmissionTasks\n"
                      "starter_code:\n  - data/spin/evaluate.py\nevaluation_paths:\n  - evaluate.py\n"
                      "sample_submission: data/spin/sample_submission.csv\nbaseline_scores:\n  - Score: 0.1\n")
    return config


def test_the_evaluation_budget_is_cpu_time(tmp_path):
    """``eval_timeout_s`` bounds the evaluation's CPU time (the wall clock, stretched by the load, is only a
    backstop for one that waits): an evaluation that computes for 0.5 s scores, one that would compute for 60 s is
    stopped at its 2 CPU-seconds, as a time-out of the submission (no reward_error)."""
    import gym_llm  # noqa: F401

    env = gym.make("LLMMLGym-v0", task_config_path=str(_spin_task(tmp_path)), reward="metric", eval_timeout_s=2.0,
                   max_turns=4)
    try:
        for seconds, scores in ((0.5, True), (60, False)):
            env.reset(seed=0)
            env.step(EXAMPLE.call("create", filename="submission.csv", content=f"seconds\n{seconds}\n"))
            started = time.monotonic()
            _, reward, terminated, _, info = env.step(EXAMPLE.call("submit"))
            assert terminated and "reward_error" not in info, info
            if scores:
                assert reward == pytest.approx(seconds) and not info["evaluation_error"], info
            else:
                assert math.isnan(info["metric"]) and "CPU-seconds" in info["evaluation_error"], info
                assert time.monotonic() - started < 30
    finally:
        env.close()


def test_step_budget_grades_the_workspace_and_truncates():
    env = gym.make("LLMMLGym-v0", task_config_path=str(MLGYM / "configs" / "tasks" / "prisonersDilemma.yaml"),
                   max_turns=2, reward="metric")
    try:
        env.reset(seed=0)
        _, _, terminated, truncated, info = env.step(EXAMPLE.call("run", command="echo hi"))
        assert not (terminated or truncated)
        _, reward, terminated, truncated, info = env.step("thinking...")
        assert truncated and not terminated and info["exit_reason"] == "max_steps"
        assert reward == pytest.approx(info["metric"]) and not math.isnan(info["metric"])
    finally:
        env.close()


def test_command_timeout_kills_the_command_and_the_workspace_survives():
    env = gym.make("LLMMLGym-v0", task_config_path=str(MLGYM / "configs" / "tasks" / "blotto.yaml"),
                   command_timeout_s=1.0, max_turns=6)
    try:
        env.reset(seed=0)
        observation, *_ = env.step(EXAMPLE.call("run", command="echo kept > note.txt; sleep 30 & sleep 30"))
        assert "ran longer than 1 s and was killed" in observation
        observation, *_ = env.step(EXAMPLE.call("run", command="cat note.txt"))
        assert observation.rstrip().endswith("kept\n<|im_end|>\n<|im_start|>assistant".rstrip()) or "kept" in \
            observation.split("cat note.txt")[-1]
    finally:
        env.close()


def test_missing_dataset_config_names_the_fix():
    with pytest.raises(FileNotFoundError, match=r"dataset_paths=\{'datasets/3SAT.yaml'"):
        gym.make("LLMMLGym-v0", task_config_path=str(MLGYM / "configs" / "tasks" / "3SATTime.yaml"))
    with pytest.raises(TypeError, match="needs task_config_path"):
        gym.make("LLMMLGym-v0")


def test_check_env_passes():
    env = gym.make("LLMMLGym-v0", task_config_path=str(MLGYM / "configs" / "tasks" / "blotto.yaml"), max_turns=4)
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_tokens_mode_appends_sampled_ids_verbatim(qwen_tokenizer):
    env = gym.make("LLMMLGym-v0", task_config_path=str(MLGYM / "configs" / "tasks" / "blotto.yaml"),
                   mode="tokens", tokenizer=qwen_tokenizer, max_turns=4, max_seq_len=8192)
    try:
        observation, _ = env.reset(seed=0)
        n = int(observation["attention_mask"].sum())
        sampled = np.asarray(qwen_tokenizer.encode(EXAMPLE.call("open", path="strategy.py") + "<|im_end|>"))
        observation, _, _, _, info = env.step(sampled)
        ids = observation["input_ids"][: int(observation["attention_mask"].sum())]
        assert (ids[n: n + len(sampled)] == sampled).all() and info["policy_mask"][n: n + len(sampled)].all()
        assert "[File: /home/agent/workspace/strategy.py" in qwen_tokenizer.decode(ids[n + len(sampled):])
    finally:
        env.close()
