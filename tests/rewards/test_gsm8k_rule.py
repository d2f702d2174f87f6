"""The GSM8K one-answer rule and the grading deadline, against adversarial answers.

Each rejected class (several candidates, negation or comparison, operator, unit multiplier, a lost sign) and the
legitimate forms that must stay accepted; math-verify under a hard deadline in any thread, with nothing waiting on a
lock it holds; vector steps whose grading runs in a thread pool finish within the deadline for every sub-env.
"""

from __future__ import annotations

import json
import threading
import time

import gymnasium as gym
import pytest

import gym_llm  # noqa: F401  (registers the envs)
from gym_llm.rewards import gsm8k
from gym_llm.rewards.deadline import DeadlineExceeded, WorkerPool
from gym_llm.rewards.gsm8k import answer_problem, grade, is_equivalent
from scripts.answer_rule_table import ACCEPTED, REJECTED, rows

WORK = "She makes 9 * 2 = 18 dollars.\n"

# (final answer, the class the rule must name)
ADVERSARIAL = [
    ("18 or 19", "several candidate"), ("[18, 19]", "several candidate"), ("19 or 18", "several candidate"),
    ("18, 19", "several candidate"), ("18 and 19", "several candidate"), ("18,5", "several candidate"),
    ("18 to 19", "several candidate"), ("not 18", "negation"), ("!= 18", "negation"), ("≠ 18", "negation"),
    ("isn't 18", "negation"), ("about 18", "negation"), ("approximately 18", "negation"), ("> 17", "negation"),
    ("at least 18", "negation"), (r"\approx 18", "negation"), ("18e3", "multiplier"), ("18E+1", "multiplier"),
    ("18k", "multiplier"), ("$18k", "multiplier"), ("$18M", "multiplier"), ("18 thousand", "multiplier"),
    ("18 million dollars", "multiplier"), ("18 x 10^3", "multiplier"), ("18**2", "operator"), ("18^2", "operator"),
    ("20 - 2", "operator"), ("17 + 1", "operator"), (r"\sqrt{324}", "operator"), ("9^{9^{9}}", "operator"),
    (r"19 \lor 18", "operator"), (r"18 \pm 1", "operator"), ("6*3", "operator"),
    # hedges, answers that are not one number, a later sentence that changes the answer
    ("18 approx", "negation"), ("18ish", "negation"), ("18 or more", "negation"), ("18 (rounded)", "negation"),
    ("18, maybe", "negation"), ("probably 18", "negation"), ("18 give or take", "negation"),
    ("18_19", "not one number"), ("18.0.0", "not one number"), ("18. Or maybe 19.", "alternative"),
    ("18. Then again, 19.", "correction"), ("x", "no number"), ("eighteen", "no number"),
]


@pytest.mark.parametrize("answer,kind", ADVERSARIAL)
def test_adversarial_final_answers_are_wrong_and_say_why(answer, kind):
    g = grade(f"{WORK}#### {answer}", "18")
    assert not g.correct and g.problem is not None and kind in g.problem, g
    assert not grade(rf"\boxed{{{answer}}}", "18").correct  # the same rule on every extraction path
    assert not grade(f"The answer is {answer}.", "18").correct


@pytest.mark.parametrize("completion,kind", [
    (f"{WORK}#### 17\n#### 18", "several final answers"), (f"{WORK}#### 18\n\n#### 17", "several final answers"),
    (r"\boxed{17} and \boxed{18}", "several final answers"), (r"\boxed{18}, or \boxed{19}", "several final answers"),
    (f"{WORK}#### 18\nor 19", "alternative"), (f"{WORK}#### 18\nThe answer is 20", "several final answers"),
    (f"{WORK}#### 18\nActually, 19.", "correction"), (f"{WORK}#### 18\nWait, I made an error: it is 20", "correction"),
    (f"{WORK}#### 18\n19", "another answer"), (f"{WORK}#### 18\nSo she makes $20 a day.", "another answer"),
    (f"{WORK}#### 18\nBut I'm not 100% sure.", "hedge"), ("I think the answer is 18.", "hedged final answer"),
])
def test_one_final_answer_across_the_completion(completion, kind):
    g = grade(completion, "18")
    assert not g.correct and g.problem is not None and kind in g.problem, g


# What follows the answer's clause may justify, restate, sign off or ask, with other numbers in it (issue 45: this
# rule once refused any later number, and "#### 18\n\nQ2: 5 + 6 = 11" was wrong; it is now one final answer and
# text that neither corrects, hedges nor states another answer for this problem).
@pytest.mark.parametrize("completion", [f"{WORK}#### 18\n#### 18", f"{WORK}#### 18\nHope this helps!",
                                        f"{WORK}#### 18\nHope you enjoyed the 2 puzzles!", f"{WORK}#### 18\n\nQ2: 5 + 6 = 11",
                                        f"{WORK}#### 18\nLet me know if you need help with the other 2 questions!",
                                        "The answer is 18, since 16 - 3 - 4 = 9 eggs are sold at $2 each.",
                                        r"\boxed{18}, so the answer is \boxed{18}", f"{WORK}#### 18. She earns 18 dollars.",
                                        f"{WORK}#### 18 <<9*2=18>>", "The answer is 18. Checking: 18 + 2 = 20."])
def test_repeating_the_same_answer_is_one_answer(completion):
    g = grade(completion, "18")
    assert g.correct and g.problem is None, g


@pytest.mark.parametrize("answer", ["(" * 3000 + ")" * 3000, r"\frac{" * 2000, "x", r"\sqrt{\sqrt{\sqrt{x}}}" * 50,
                                    "{" * 5000, "eighteen"])
def test_a_numeric_reference_never_reaches_math_verify(monkeypatch, answer):
    """Answers without one plain number are wrong at once: no CAS call, no worker to stall or kill."""
    def forbidden(*args, **kwargs):
        raise AssertionError("math-verify was called for a numeric reference")

    monkeypatch.setattr(gsm8k, "_math_verify_equal", forbidden)
    start = time.process_time()  # CPU time: a loaded machine cannot fail it, a CAS call or a backtracking pattern can
    g = grade(f"{WORK}#### {answer}", "18")
    assert not g.correct and g.error is None and time.process_time() - start < 0.5, g
    assert not is_equivalent(answer, "18")


@pytest.mark.parametrize("answer", ["-$18", "$-18", "−$18", "-18", r"-\$18"])
def test_a_sign_before_the_currency_is_kept(answer):
    g = grade(f"{WORK}#### {answer}", "18")
    assert not g.correct and g.problem is None
    assert grade(f"{WORK}#### {answer}", "-18").correct


@pytest.mark.parametrize("answer", ACCEPTED + ["18 apples", "18 dollars per day", "$ 18", "18.0", "18/1", "18 (dollars)",
                                               "**Answer:** 18", "18 cm", "18 m", "USD 18", "18 USD"])
def test_legitimate_forms_stay_accepted(answer):
    reference = "70000" if "70" in answer else "18"
    g = grade(answer if answer.startswith(("\\boxed", "**Answer")) else f"{WORK}#### {answer}", reference)
    assert g.correct and g.problem is None, g


def test_the_comparison_table_is_what_the_docs_show():
    table = rows()
    assert [ours for answer, _, ours, *_ in table] == [True] * len(ACCEPTED) + [False] * len(REJECTED)
    torchrl = [verdict for *_, verdict in table]
    assert None not in torchrl  # TorchRL's own parser ran
    # the classes this issue found are paid by the lenient rules we compare with, and not by ours
    flexible = {answer: flex for answer, _, _, _, flex, _ in table}
    assert flexible["not 18"] and flexible["19 or 18"] and flexible["$18k"]


def test_answer_problem_examples():
    assert answer_problem("$70,000") is None
    assert answer_problem("18 or 19") == "several candidate numbers (18, 19)"
    assert answer_problem(r"\frac{36}{2}") is None


# ---------------------------------------------------------------------------------------------- deadline
PATHOLOGICAL = "9^{9^{9}}"


def test_math_verify_deadline_holds_in_any_thread_and_holds_no_lock():
    warm = [threading.Thread(target=is_equivalent, args=(r"\sqrt{4}", "2")) for _ in range(2)]
    for t in warm:  # two workers up and idle: the ordinary check below never pays a worker start
        t.start()
    for t in warm:
        t.join(60)
    results: dict[str, object] = {}

    def pathological():
        start = time.perf_counter()
        try:
            results["pathological"] = is_equivalent(PATHOLOGICAL, "18", timeout_s=2.0)
        except DeadlineExceeded as e:
            results["pathological"] = e
        results["pathological_s"] = time.perf_counter() - start
        results["pathological_end"] = time.perf_counter()

    def ordinary():
        time.sleep(0.3)  # while the pathological check runs
        start = time.perf_counter()
        results["ordinary"] = is_equivalent(r"\sqrt{9}", "3")
        results["ordinary_s"] = time.perf_counter() - start
        results["ordinary_end"] = time.perf_counter()

    threads = [threading.Thread(target=pathological), threading.Thread(target=ordinary)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert isinstance(results["pathological"], DeadlineExceeded), results
    assert 1.9 < results["pathological_s"] < 6.0, results
    # it did not wait on the stuck one: done while the stuck check was still running
    assert results["ordinary"] is True and results["ordinary_end"] < results["pathological_end"], results
    assert is_equivalent(r"\sqrt{16}", "4")  # and the pool goes on


def test_worker_pool_reports_errors_and_survives_them():
    pool = WorkerPool()
    try:
        assert pool.call("math:factorial", 5, timeout_s=30) == 120
        with pytest.raises(RuntimeError, match="ValueError"):
            pool.call("math:factorial", -1, timeout_s=30)
        with pytest.raises(DeadlineExceeded):
            pool.call("time:sleep", 5, timeout_s=0.5)
        assert pool.killed == 1 and pool.call("math:factorial", 4, timeout_s=30) == 24
    finally:
        pool.close()


def test_grading_past_the_deadline_fails_closed_with_a_reason(monkeypatch):
    monkeypatch.setattr(gsm8k, "GRADING_TIMEOUT_S", 1.5)
    g = grade(rf"\boxed{{{PATHOLOGICAL}}}", "x^2")  # a symbolic reference: math-verify decides
    assert not g.correct and g.error is not None and "DeadlineExceeded" in g.error


@pytest.mark.parametrize("env_id,kwargs", [("LLMGSM8K-v0", {"num_workers": 2}), ("LLMPythonTool-v0", {})])
def test_a_pathological_answer_in_one_sub_env_does_not_hold_up_the_step(monkeypatch, env_id, kwargs):
    """Vector grading runs in a thread pool: the stuck sub-env is cut at the deadline, the others are graded."""
    monkeypatch.setattr(gsm8k, "GRADING_TIMEOUT_S", 2.0)
    tasks = [{"question": "Simplify x times x.", "answer": "x^2"}] + [
        {"question": f"What is {k} + {k}?", "answer": f"#### {2 * k}"} for k in range(1, 4)]
    envs = gym.make_vec(env_id, num_envs=4, vectorization_mode="vector_entry_point", tasks=tasks, **kwargs)
    gsm8k._math_verify_pool().warm(1)  # the worker's start (python, sympy) is not the deadline's: keep it out
    try:
        envs.reset(seed=0, options={"task_ids": [0, 1, 2, 3]})
        actions = (rf"\boxed{{{PATHOLOGICAL}}}", "#### 2", "#### 4 or 5", "#### 6")
        start = time.perf_counter()
        _, rewards, terminated, _, infos = envs.step(actions)
        elapsed = time.perf_counter() - start
        final = infos["final_info"]
        assert elapsed < 2.0 + 3.0, elapsed
        assert list(rewards) == [0.0, 1.0, 0.0, 1.0] and terminated.all()
        assert "DeadlineExceeded" in final["reward_error"][0]
        assert "several candidate" in final["answer_problem"][2]
    finally:
        envs.close()


def test_the_python_tool_env_grades_by_the_same_rule():
    env = gym.make("LLMPythonTool-v0", tasks=[{"question": "What is 6 times 3?", "answer": "#### 18"}])
    try:
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step("The answer is\n#### 18 or 19")
        assert terminated and reward == 0.0 and "several candidate" in info["answer_problem"]
        env.reset(seed=0)
        _, reward, _, _, info = env.step("#### $18")
        assert reward == 1.0 and info["answer_problem"] == "" and json.loads(info.get("tool_calls", "[]")) == []
    finally:
        env.close()
