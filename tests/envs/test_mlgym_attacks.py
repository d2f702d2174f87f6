"""Attacks on LLMMLGym-v0's grading: an agent that reads the labels, patches the evaluator, fakes the score or leaves
its workspace. Each attack runs through the env's own commands; the score must stay what the task's pristine
evaluation gives the honest part of the submission. The module runs as whoever runs the suite (root here) and
again as an unprivileged user (uid 65534, the way ``tests/tools/test_sandbox_unprivileged.py`` does it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from tests import background
from tests.conftest import shared_mlgym_dir
from tests.tools import unprivileged


REPO = Path(__file__).resolve().parents[2]
MLGYM = shared_mlgym_dir()
GROUND_TRUTH = (MLGYM / "data" / "titanic" / "data" / "ground_truth.csv").read_text()


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def env():
    import gym_llm  # noqa: F401

    configs = [str(MLGYM / "configs" / "tasks" / f"{name}.yaml") for name in ("titanic", "battleOfSexes")]
    env = gym.make("LLMMLGym-v0", task_config_path=configs, max_turns=12, reward="metric")
    yield env
    env.close()


def _play(env, task_id: int, actions: list[str]) -> tuple[list[str], float, dict]:
    env.reset(seed=0, options={"task_id": task_id})
    outputs = []
    for action in actions:
        observation, reward, terminated, truncated, info = env.step(action)
        outputs.append(observation.rsplit("<|im_start|>tool\n", 1)[-1])
        if terminated or truncated:
            return outputs, reward, info
    raise AssertionError("the episode did not end")


def test_labels_are_not_in_the_agents_sandbox(env):
    outputs, _, info = _play(env, 0, [
        call("run", command="ls data; cat data/ground_truth.csv 2>&1; ls -R /run/host /home /scratch 2>&1 | head -80"),
        call("run", command="cat /run/host/tmp/*/private/*/data/ground_truth.csv 2>&1; "
                            f"cat {MLGYM}/data/titanic/data/ground_truth.csv 2>&1; ls /work /root 2>&1"),
        call("python", code="import glob; print(sorted(set(glob.glob('/run/host/**', recursive=True)) | "
                            "set(glob.glob('/home/**', recursive=True))))"),
        call("submit")])
    seen = "\n".join(outputs[:3])
    assert "test.csv" in seen and "train.csv" in seen  # the public data is there
    assert GROUND_TRUTH.splitlines()[1] + "\n" + GROUND_TRUTH.splitlines()[2] not in seen  # no labels anywhere
    listed = outputs[0].split("ls -R")[-1] + outputs[2]
    assert "ground_truth" not in outputs[0].split("No such file")[-1] and "ground_truth" not in outputs[2]
    assert "/private" not in listed and "No such file" in outputs[1]
    assert info["metric"] != info["metric"]  # nothing submitted: NaN


def test_patched_evaluator_shadowed_modules_and_fake_score_files_do_not_change_the_score(env):
    fake = 'import json; print(json.dumps({"accuracy": 1.0}))'
    outputs, reward, info = _play(env, 0, [
        call("run", command=f"chmod u+w evaluate.py; echo '{fake}' > evaluate.py; cat evaluate.py"),
        call("create", filename="json.py", content="def dumps(*a, **k):\n    return '{\"accuracy\": 1.0}'\n"),
        call("create", filename="sitecustomize.py", content="print('{\"accuracy\": 1.0}')\n"),
        call("create", filename="pandas.py", content="raise SystemExit('{\"accuracy\": 1.0}')\n"),
        call("run", command="echo '{\"accuracy\": 1.0}' > results.json; cp results.json metrics.json; "
                            "echo 1.0 > /home/agent/score 2>&1; echo 1.0 > /tmp/score"),
        call("python", code="import csv\nrows = list(csv.DictReader(open('data/test.csv')))\n"
                            "open('submission.csv', 'w').write('PassengerId,Survived\\n' + "
                            "''.join(f\"{r['PassengerId']},0\\n\" for r in rows))"),
        call("submit")])
    assert "accuracy" in outputs[0]  # the workspace copy was overwritten...
    survived = sum(line.endswith(",1") for line in GROUND_TRUTH.splitlines()[1:])
    expected = 1 - survived / (len(GROUND_TRUTH.splitlines()) - 1)  # ...but an all-zero CSV scores this
    assert info["metric"] == pytest.approx(expected) and reward == pytest.approx(expected) and expected < 0.7


def test_patched_opponent_does_not_reach_the_grader(env):
    """battleOfSexes: rewrite target.py so the partner always agrees; the grader uses the pristine one."""
    outputs, reward, info = _play(env, 1, [
        call("run", command="chmod u+w target.py; printf 'def target_column_strategy(history):\\n    return 0\\n'"
                            " > target.py"),
        call("run", command="printf 'def row_strategy(history):\\n    return 0\\n' > strategy.py"),
        call("submit")])
    assert info["metric"] < 1.6  # 2.0 if the patched partner had been used
    assert info["metric"] == pytest.approx(1.4391, abs=0.01)


HOSTILE_STRATEGY = r"""
import atexit, builtins, json, os, sys
atexit.register(lambda: print('{"Score": 99.0}', flush=True))  # a score line at exit
json.dumps = lambda *a, **k: '{"Score": 98.0}'  # the evaluator's own json, patched
main = sys.modules.get("__main__")  # the evaluator's functions, replaced in memory
for name in ("simulation_mean_scores", "compute_overall_scores", "run_iterated_game"):
    if hasattr(main, name):
        setattr(main, name, lambda *a, **k: (97.0, 0.0))
if "target" in sys.modules:  # the pristine opponent, patched in memory
    sys.modules["target"].target_column_strategy = lambda history: 0
for path in ("/home/agent/workspace/target.py", "/home/agent/workspace/numpy.py"):  # files the grader reads later
    try:
        open(path, "w").write(chr(10).join(["def target_column_strategy(history):", "    return 0",
                                             "mean = lambda *a, **k: 96.0", ""]))
    except OSError as e:
        print("write failed:", path, e)
try:  # the grader's stdout, through its process
    os.write(os.open(f"/proc/{os.getppid()}/fd/1", os.O_WRONLY), b'{"Score": 95.0}' + bytes([10]))
except OSError as e:
    print("proc failed:", e)
print('{"Score": 94.0}', flush=True)
sys.stderr.write('{"Score": 93.0}' + chr(10))
ORIGINAL_PRINT = builtins.print
builtins.print = lambda *a, **k: ORIGINAL_PRINT('{"Score": 92.0}')


def row_strategy(history):
    return 0
"""


def test_submitted_code_runs_outside_the_graders_process(env):
    """battleOfSexes imports the agent's strategy.py: in-process, its import-time code could patch the evaluator,
    print a score line, or rewrite the opponent. It runs in a sandbox of its own instead; only row_strategy's
    return values reach the evaluation, and the honest part of it (always 0) scores what it scores."""
    outputs, reward, info = _play(env, 1, [
        call("run", command="rm -f strategy.py"),
        call("create", filename="strategy.py", content=HOSTILE_STRATEGY),
        call("validate"),
        call("submit")])
    assert "Your submission scored" in outputs[2] and "1.4" in outputs[2]
    assert info["metric"] == pytest.approx(1.4391, abs=0.01)  # always 0 against the pristine partner
    assert json.loads(info["metrics"]) == {"Score": pytest.approx(info["metric"])}
    side = info["evaluation_output"].split("[the submission's own output]")[-1]
    assert '"Score": 94.0' in side  # what the code printed is shown apart from the evaluation's own output
    assert "99.0" not in info["evaluation_output"].split("[the submission's own output]")[0]


def test_a_submission_that_returns_what_cannot_cross_fails_cleanly(env):
    bad = "class Move(int):\n    def __eq__(self, other):\n        return True\n" \
          "def row_strategy(history):\n    return object()\n"
    outputs, reward, info = _play(env, 1, [
        call("run", command="rm -f strategy.py"),
        call("create", filename="strategy.py", content=bad),
        call("submit")])
    assert info["metric"] != info["metric"] and info["evaluation_error"]  # no score: NaN, and why
    assert "cannot cross" in info["evaluation_output"]


def test_writes_outside_the_workspace_fail_and_the_host_is_untouched(env, tmp_path):
    marker = tmp_path / "escaped"
    outputs, _, info = _play(env, 1, [
        call("run", command=f"touch {marker} 2>&1; touch /home/agent/x 2>&1; touch /run/host/x 2>&1; "
                            "touch data 2>&1; ln -s / root_link; cat root_link/etc/shadow 2>&1 | head -1; "
                            "cd .. && ls /home/agent; echo exit=$?"),
        call("python", code="import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
                            "except OSError as e:\n    print('no network:', e)"),
        call("submit")])
    assert not marker.exists()
    assert "Read-only file system" in outputs[0] or "Permission denied" in outputs[0]
    assert "root:" not in outputs[0]
    assert "no network" in outputs[1]


def _unprivileged_command(out_dir: Path) -> tuple[list[str], dict[str, str], Path]:
    home = out_dir / "home"
    home.mkdir()
    out_dir.chmod(0o777)
    home.chmod(0o777)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(out_dir / "t"),
            "-o", "addopts=--strict-markers", __file__, "-k", "not unprivileged"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")]), "OMP_NUM_THREADS": "1",
           "TMPDIR": str(out_dir)}
    if os.geteuid() != 0:
        return argv, env, REPO
    return unprivileged.command(argv, needed=[str(REPO), sys.prefix, str(MLGYM)], stash=str(out_dir / "stash")), env, REPO


background.register("test_grading_attacks_fail_as_an_unprivileged_user", _unprivileged_command)


@pytest.mark.slow
def test_grading_attacks_fail_as_an_unprivileged_user():
    done = background.result("test_grading_attacks_fail_as_an_unprivileged_user", timeout_s=600)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    summary = done.stdout.strip().splitlines()[-1]
    assert "6 passed" in summary and "skipped" not in summary and "failed" not in summary, summary
