"""Graders that run in the env's thread are linear in the reply: replies built to make their regular expressions
backtrack (found by fuzzing repeated fragments of model-like text, 1.5k vs 12k characters) grade at 64k characters
in milliseconds. Before the fix each of these took seconds to minutes (``"\\n" * 65_536``: ~7 min in GSM8K's
``A:``-line pattern), in a step no deadline bounds. A hang guard, not a benchmark: the limit is 1 s of this process's
CPU time, over 10x the slowest case here (70 ms); CPU time, not wall time, so a loaded or stalled machine (a CI run
once took 1.03 s of wall time for a 40 ms case) cannot fail it while a backtracking pattern still does."""

from __future__ import annotations

import time

import pytest

from fractions import Fraction

from gym_llm.core.tasks import Task
from gym_llm.envs.countdown import grade_countdown
from gym_llm.rewards import answers, gsm8k, short_answer
from gym_llm.tools.parsing import parse_tool_calls

N = 65_536
FRAGMENTS = ["\n", " \n", "\t\n", "<<", "*1 ", "1_", "*1", "1 _", "the _", "answer(", "(answer", ">" * 3 + "\n", "**1 ",
             # the one-final-answer rule's patterns (issue 45): clause breaks, corrections, alternatives, hedges, tags
             "1, ", "1 or ", "or 1 ", "1,1", ", or maybe ", "actually ", "wait ", "maybe ", "either 1 ", "not ", "so 1 ",
             ", since 1", "1 = ", "- 1 ", "1. ", "I think ", "<answer>", "</answer>", "<answer>1</answer> ", "#### 1\n",
             "1 is the answer ", "is the ", "(1) ", "Total: 1 ", "1111111111", "?\n"]
PREFIXES = ["", "#### ", "The answer is ", "Answer: ", "\\boxed{", "<answer>1</answer>", "#### 18\n"]


def built(prefix: str, fragment: str) -> str:
    return prefix + fragment * (N // len(fragment))


def _tagged(reply: str):
    read = answers.read_final_answer(reply)
    return answers.tagged_answer_problem(read, Fraction(18), lambda other: other == read.text)


GRADERS = {
    "gsm8k": lambda reply: gsm8k.grade(reply, "18"),
    "answer_tag": _tagged,
    "countdown": lambda reply: grade_countdown(reply, Task(0, (), "18", {"nums": [3, 6], "target": 18})),
    "short_answer": lambda reply: short_answer.grade(reply, ["18"]),
    "tool_calls": lambda reply: parse_tool_calls(reply, code_block_tool="python"),
}


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("fragment", FRAGMENTS)
@pytest.mark.parametrize("grader", sorted(GRADERS))
def test_a_reply_built_to_backtrack_grades_in_linear_time(grader, fragment, prefix):
    reply = built(prefix, fragment)
    start = time.process_time()
    result = GRADERS[grader](reply)
    assert time.process_time() - start < 1.0, (grader, prefix, fragment)
    if grader in ("gsm8k", "countdown"):
        assert result.correct is False or fragment == "#### 1\n" or prefix == "#### 18\n"


@pytest.mark.parametrize("answer, extracted", [
    ("#### **18**", "18"), ("#### ***18***", "18"), ("#### **_18_**", "18"), ("The answer is __18__.", "18"),
    ("A: 9 * 2 = 18", "18"), ("#### 18 <<9*2=18>>", "18"),
])
def test_emphasis_and_calculator_notes_still_read_after_the_fix(answer, extracted):
    assert gsm8k.grade(answer, "18").correct, answer
