"""The browser env's short-answer rule (``gym_llm.rewards.short_answer``): the ``Answer:`` line, and replies built
to make its regular expression backtrack (it once took 5 s on 20,000 blank lines: quadratic in the reply)."""

from __future__ import annotations

import time

import pytest

from gym_llm.rewards.short_answer import extract_answer, grade


@pytest.mark.parametrize("reply, answer, formatted", [
    ("I looked it up.\nAnswer: 86.50 dollars", "86.50 dollars", True),
    ("> **Answer:** **86.50 dollars**  \n", "86.50 dollars", True),
    ("answer :\t7 *", "7", True),
    ("Answer: 1\nthen\nANSWER: 2", "2", True),  # the last Answer: line
    ("no marker here\n\n  1874  \n", "1874", False),  # else the last non-empty line
    ("Answer:\n\n**5**\nDone.", "5", True),  # a marker alone on its line: the next non-empty line
    ("Answer:", "", True),
])
def test_the_answer_line(reply, answer, formatted):
    assert extract_answer(reply) == (answer, formatted)


@pytest.mark.parametrize("reply", [
    "\n" * 65_536, " \n" * 32_768, "\t\n" * 32_768, (">" * 30_000 + "\n") * 2, "Answer:" + "\t" * 65_000 + "x",
    ("answer" + " " * 3_000 + "\n") * 20, "Answer:" + "* " * 30_000 + "y", ("Answer:" + "*" * 2_000 + "\n") * 30,
])
def test_replies_built_to_backtrack_grade_in_linear_time(reply):
    start = time.process_time()
    assert grade(reply, ["1"]).correct is False
    assert time.process_time() - start < 1.0  # a hang guard, not a benchmark: these take < 10 ms of CPU time
