"""LLMCountdown-v0: the exact parser against an independent enumeration, generated puzzles, grading, TinyZero files.
(check_env, vector parity and groups: tests/envs/test_all_envs.py, through the registry.)"""

from __future__ import annotations

import itertools
import json
from fractions import Fraction

import gymnasium as gym
import pytest

import gym_llm  # noqa: F401
from gym_llm.core.tasks import Task
from gym_llm.envs.countdown import (CountdownError, check_expression, evaluate, generate_countdown, grade_countdown,
                                    load_countdown_tasks)


def all_expressions(numbers):
    """Every fully parenthesised expression over ``numbers`` (each used once, any order) with its value, computed
    here by combining values directly — not by parsing the text."""
    if len(numbers) == 1:
        yield str(numbers[0]), Fraction(numbers[0])
        return
    for split in range(1, len(numbers)):
        for left_idx in itertools.combinations(range(len(numbers)), split):
            left = [numbers[i] for i in left_idx]
            right = [numbers[i] for i in range(len(numbers)) if i not in left_idx]
            for lt, lv in all_expressions(left):
                for rt, rv in all_expressions(right):
                    yield f"({lt} + {rt})", lv + rv
                    yield f"({lt} - {rt})", lv - rv
                    yield f"({lt} * {rt})", lv * rv
                    if rv != 0:
                        yield f"({lt} / {rt})", lv / rv


def test_the_parser_computes_every_expression_over_four_numbers_exactly():
    count = 0
    for text, value in all_expressions([7, 3, 12, 2]):
        assert evaluate(text) == (value, [int(t) for t in text.replace("(", " ").replace(")", " ").split()
                                          if t.isdigit()]), text
        assert evaluate(text.replace("(", "").replace(")", ""))[0] == eval_precedence(text.replace("(", "").replace(")", ""))
        count += 1
    assert count == 7680  # 4! orders x 5 shapes x 4^3 operator choices, per the enumeration


def eval_precedence(flat: str) -> Fraction:
    """Value of a parenthesis-free expression by the usual precedence, computed independently of the parser:
    products/quotients first (left to right), then sums (left to right)."""
    tokens = flat.split()
    terms, ops = [Fraction(int(tokens[0]))], []
    for op, number in zip(tokens[1::2], tokens[2::2]):
        value = Fraction(int(number))
        if op == "*":
            terms[-1] *= value
        elif op == "/":
            terms[-1] /= value
        else:
            ops.append(op)
            terms.append(value)
    total = terms[0]
    for op, term in zip(ops, terms[1:]):
        total = total + term if op == "+" else total - term
    return total


@pytest.mark.parametrize("text,why", [
    ("__import__('os').system('true')", "unexpected '_'"),
    ("2 ** 3", "unexpected '\\*'"),
    ("-3 + 5", "a sign must stand between two numbers"),
    ("3.5 * 2", "unexpected '.'"),
    ("1e3", "unexpected 'e'"),
    ("0x10", "unexpected 'x'"),
    ("07 + 1", "leading zeros"),
    ("(1 + 2", "not closed"),
    ("1 + 2)", "after a complete expression"),
    ("4 / (2 - 2)", "division by zero"),
    ("٣ + 4", "unexpected '٣'"),
    ("(" * 40 + "1" + ")" * 40, "nested deeper"),
    ("1 + " * 100 + "1", "at most 256"),
    ("", "empty"),
])
def test_anything_but_arithmetic_is_refused_with_the_reason(text, why):
    with pytest.raises(CountdownError, match=why):
        evaluate(text)


def test_number_usage_rules():
    assert check_expression("(100 - 4) / (7 - 3)", [3, 4, 7, 100], 24) is None
    assert check_expression("100 / 4 - 1", [3, 4, 7, 100], 24) == "uses 1, which is not among the numbers"
    assert check_expression("7 * 3 + 3", [3, 4, 7, 100], 24) == "uses 3 twice but it is given once"
    assert check_expression("7 * 3 + 3", [3, 3, 7], 24) is None  # a number given twice may be used twice
    assert check_expression("4 * 7 - 4", [4, 7, 4], 24) is None
    assert check_expression("4 * 7", [3, 4, 7, 100], 28) is None  # a subset is allowed by default...
    assert "leaves out [3, 100]" in check_expression("4 * 7", [3, 4, 7, 100], 28, use_all=True)  # ...not with use_all
    assert check_expression("4 * 7 = 28", [4, 7], 28) is None  # "= result" is read as a comment
    assert check_expression("4 + 7", [4, 7], 28) == "equals 11, not 28"


def test_generated_puzzles_are_solvable_by_their_own_solution_and_deterministic():
    puzzles = generate_countdown(300, 5, num_numbers=(3, 5), max_target=120)
    assert puzzles == generate_countdown(300, 5, num_numbers=(3, 5), max_target=120)
    assert puzzles != generate_countdown(300, 6, num_numbers=(3, 5), max_target=120)
    for puzzle in puzzles:
        assert 3 <= len(puzzle["nums"]) <= 5 and all(1 <= n <= 99 for n in puzzle["nums"])
        assert 1 <= puzzle["target"] <= 120
        assert check_expression(puzzle["solution"], puzzle["nums"], puzzle["target"], use_all=True) is None


def test_grading_a_reply():
    task = load_countdown_tasks(tasks=[{"nums": [3, 4, 7, 100], "target": 24}])[0]
    assert "3, 4, 7, 100" in task.prompt and "24" in task.prompt
    right = grade_countdown("Let me think... <answer> (100 - 4) / (7 - 3) </answer>", task)
    assert (right.correct, right.formatted, right.extracted, right.problem) == (True, True, "(100 - 4) / (7 - 3)", None)
    wrong = grade_countdown("<answer>7 * 3 + 3</answer>", task)
    assert (wrong.correct, wrong.formatted, wrong.problem) == (False, True, "uses 3 twice but it is given once")
    garbage = grade_countdown("<answer>twenty-four</answer>", task)
    assert (garbage.correct, garbage.formatted) == (False, False)
    missing = grade_countdown("The answer is (100 - 4) / (7 - 3).", task)  # no tag, no Answer: line
    assert (missing.correct, missing.formatted) == (False, False) and "no <answer>" in missing.problem
    assert grade_countdown("Answer: 100/4 - 7 + 3*2", Task(0, (), "24", {"nums": [3, 4, 7, 100, 2], "target": 24})).correct


def test_env_rewards_info_and_format_reward():
    env = gym.make("LLMCountdown-v0", num_generated=20, format_reward=0.1)
    env.reset(seed=0)
    task = env.unwrapped.episode.task
    _, reward, terminated, _, info = env.step(f"<answer>{task.data['solution']}</answer>")
    assert (reward, terminated, info["correct"], info["reference_answer"]) == (1.1, True, True, str(task.data["target"]))
    env.reset()
    _, reward, _, _, info = env.step("<answer>1 + 1 + 1 + 1 + 1</answer>")
    assert reward == pytest.approx(0.1) and not info["correct"] and info["answer_problem"]
    env.close()


def test_tinyzero_files_from_a_users_path(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {"target": [24, 52], "nums": [[3, 4, 7, 100], [77, 65, 44, 43]]}  # TinyZero's columns
    pq.write_table(pa.table(rows), tmp_path / "train.parquet")
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps({"nums": n, "target": t})
                                                    for n, t in zip(rows["nums"], rows["target"])))
    for path in ("train.parquet", "tasks.jsonl"):
        env = gym.make("LLMCountdown-v0", data_files=str(tmp_path / path), use_all_numbers=True, task_order="sequential")
        env.reset(options={"task_id": 1})
        assert "77, 65, 44, 43" in env.unwrapped.episode.task.prompt
        _, reward, *_ = env.step("<answer>(77 - 65) * 43 / 44</answer>")  # = 11.72..., not 52
        assert reward == 0.0
        env.reset(options={"task_id": 0})
        assert env.step("<answer>(100 - 4) / (7 - 3)</answer>")[1] == 1.0
        env.close()
    with pytest.raises(ValueError, match="Countdown record 0 needs 'nums'"):
        gym.make("LLMCountdown-v0", tasks=[{"numbers": [1, 2], "target": 3}])


def test_task_sources_follow_the_shared_rule():
    """tasks= > data_files= > source (tasks/loading.records_from_source, as GSM8K and IFEval)."""
    records = [{"nums": [1, 2], "target": 3}]
    assert [t.data["nums"] for t in load_countdown_tasks(tasks=records, num_generated=5)] == [[1, 2]]
    assert len(load_countdown_tasks(num_generated=5)) == 5  # default: generated
    with pytest.raises(ValueError, match="source='file' needs data_files= \\(TinyZero's .parquet"):
        load_countdown_tasks(source="file")
    with pytest.raises(ValueError, match="source must be 'file', 'generated', 'hub' or None, got 'web'"):
        load_countdown_tasks(source="web")


def test_a_sign_off_after_the_tag_is_paid_and_a_correction_is_not():
    env = gym.make("LLMCountdown-v0", num_generated=5)
    env.reset(seed=0, options={"task_id": 0})
    solution = env.unwrapped.episode.task.data["solution"]
    _, reward, _, _, info = env.step(f"<answer>{solution}</answer>\nHope this helps, good luck with round 2!")
    assert reward == 1.0 and info["correct"], info
    env.reset(options={"task_id": 0})
    _, reward, _, _, info = env.step(f"<answer>{solution}</answer>\nHmm, let me recheck... that doesn't add up.")
    assert reward == 0.0 and "correction" in info["answer_problem"], info
    env.close()
