"""The one-final-answer rule (``gym_llm.rewards.final_answer``), class by class, on each scored env's grade: what may
follow an answer (justifications, sign-offs, restatements, units, questions to the reader, all with other numbers) and
what may not (corrections, alternatives, hedges, another stated answer). Through ``gym.make``: the env tests
(tests/envs/test_gsm8k_env.py, test_countdown_env.py, test_reasoning_gym_env.py)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gym_llm.core.tasks import Task
from gym_llm.envs.countdown import equation_of, grade_countdown
from gym_llm.rewards.answers import decorations_removed, read_final_answer, tagged_answer_problem
from gym_llm.rewards.final_answer import later_problem, split_clause
from gym_llm.rewards.gsm8k import grade

WORK = "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\nShe makes 9 * 2 = $18 every day at the farmers' market.\n"

ONE_ANSWER = {  # class -> replies whose one answer is 18
    "sign_off": ["#### 18\nLet me know if you need help with the other 2 questions!",
                 "#### 18\n\nI hope this helps! Feel free to ask about problem 2.",
                 "#### 18\nHope you enjoyed the 2 puzzles!", "The answer is 18. Good luck with the other 9 on the sheet!",
                 "#### 18\n\nIf I made a mistake anywhere, just let me know.", "#### 18\n1. Reread the question.\n2. Try #4."],
    "justification": ["The answer is 18, since 16 - 3 - 4 = 9 eggs are sold at $2 each.",
                      "The answer is 18 because she sells 9 eggs at $2 each.", "#### 18\n(This is because 9 * 2 = 18.)",
                      "**Answer: 18** — because she sells 9 eggs.", "18 is the answer, since 16 - 3 - 4 = 9 eggs are sold.",
                      "\\boxed{18}, because she sells 9 eggs at $2.", "The answer is 18: 16 - 3 - 4 = 9 eggs, at $2 each.",
                      "**18**, since 16 - 3 - 4 = 9 eggs are sold."],
    "restatement": ["#### 18\nSo Janet makes $18 every day.", "#### 18\nShe makes 9 * 2 = $18 every day at the farmers' market.",
                    "The answer is 18. Once more: 18.", "#### 18\nThat means 18 dollars altogether."],
    "units": ["#### $18.00 per day", "The answer is 18 dollars.", "#### 18 m^2", "\\boxed{18 \\text{ dollars}}"],
    "question": ["#### 18\nDoes that make sense?", "#### 18\nShould I also solve part (b), the one with 9?",
                 "#### 18\nIs there a step (1, 2, or 3) you'd like me to expand on?",
                 "The answer is 18. Maybe you'd like to try problem 3 next?"],
}
NOT_ONE_ANSWER = {  # class -> (reply, a word of the reason) where the reply also states 18
    "correction": [("#### 18\nActually, 19.", "correction"), ("#### 19\nActually, 18.", "correction"),
                   ("#### 18\nWait, I made an error: it is 20", "correction"), ("#### 18\nOops, I meant 19.", "correction"),
                   ("The answer is 18. No, wait, it's 19.", "correction"), ("#### 18\nOn second thought, 19.", "correction")],
    "alternative": [("#### 18. Or 19.", "alternative"), ("#### 18\nor 19", "alternative"), ("#### 18 or 19", "several"),
                    ("The answer is 18 (or 19, depending on how you count).", "alternative"),
                    ("#### 18\nEither 18 or 19, depending on interpretation.", "alternative"),
                    ("#### 18\nAlternatively, it could be 19.", "could"), ("\\boxed{18} or \\boxed{19}", "several")],
    "hedge": [("#### 18\nBut I'm not 100% sure.", "hedge"), ("The answer is probably 18.", "negation"),
              ("I think the answer is 18.", "hedged"), ("#### 18\nI might be wrong.", "hedge"), ("My best guess is 18.", "hedged"),
              ("#### 18\nI believe this is correct, but check with your teacher.", "hedge"), ("#### ~18", "negation")],
    "two_answers": [("#### 18\n#### 19", "several final answers"), ("#### 18\nThe answer is 20", "several final answers"),
                    ("The answer is 19.\n#### 18", "several final answers"), ("#### 18\nA: 19", "several final answers")],
    "contradiction": [("#### 18\n19", "another answer"), ("#### 18\nSo the total is 19.", "another answer"),
                      ("#### 18\nShe makes 9 * 2 = $20 every day at the farmers' market.", "another answer"),
                      ("#### 18\nAll in all, that's 20.", "another answer")],
}


@pytest.mark.parametrize("cls,reply", [(c, r) for c, replies in ONE_ANSWER.items() for r in replies])
def test_what_may_follow_an_answer(cls, reply):
    g = grade(WORK + reply, "18")
    assert g.correct and g.problem is None, (cls, g)


@pytest.mark.parametrize("cls,reply,why", [(c, r, w) for c, cases in NOT_ONE_ANSWER.items() for r, w in cases])
def test_what_may_not(cls, reply, why):
    for reference in ("18", "19"):  # wrong whichever of the two numbers is right
        g = grade(WORK + reply, reference)
        assert not g.correct, (cls, reference, g)
    assert why in grade(WORK + reply, "18").problem, grade(WORK + reply, "18")


def test_the_answer_clause_ends_where_a_justification_starts():
    assert split_clause("18, since 16 - 3 - 4 = 9.") == ("18", ", since 16 - 3 - 4 = 9.")
    assert split_clause("18 or 19, since")[0] == "18 or 19" and split_clause("18, 19")[0] == "18, 19"
    assert split_clause("18 (9 eggs at $2)")[0] == "18 " and split_clause("18, and 19")[0] == "18, and 19"
    # a prose answer runs through "so"/"making" to its result
    assert split_clause("she sells 9 eggs at $2, so she makes $18.")[0] == "she sells 9 eggs at $2, so she makes $18"
    assert later_problem(" Thanks! See you in 2 days.", Fraction(18)) is None
    assert later_problem(" Hmm, 19?", Fraction(18)).startswith("a correction")


def test_reasoning_before_think_is_scratch_work():
    assert grade("<think>The answer is 17? #### 17. Wait, no.</think>\n#### 18\nHope this helps!", "18").correct
    assert grade("<think>She makes 9 * 2 = 18.</think>", "18").correct  # nothing after the reasoning: it is read


COUNTDOWN = Task(0, (), "36", {"nums": [51, 12, 48], "target": 36})


@pytest.mark.parametrize("reply", [
    "<answer>12 * (51 - 48)</answer>\nLet me know if you'd like one that uses only 2 of the 3 numbers!",
    "<answer>$(51 - 48) \\times 12 = 36$</answer>", "<answer>**36 = 12 x (51 − 48)**</answer>",
    "<answer>12 * (51 - 48)</answer>\nThis works because 51 - 48 = 3 and 3 * 12 = 36.",
    "<think>Try <answer>51 + 48</answer>? No.</think>\n<answer>12 * (51 - 48)</answer>",
    "<answer>12 * (51 - 48)</answer>\nSo 12 * 3 = 36. Want another way to make 36?",
])
def test_countdown_pays_one_right_equation_however_it_is_closed(reply):
    g = grade_countdown(reply, COUNTDOWN)
    assert g.correct and g.problem is None, g


@pytest.mark.parametrize("reply,why", [
    ("<answer>12 * (51 - 48)</answer>\nWait, that's wrong. <answer>51 - 48 + 12</answer>", "equals 15"),
    ("<answer>51 - 48 + 12</answer>\nActually: <answer>12 * (51 - 48)</answer>", "several final answers"),
    ("<answer>12 * (51 - 48) = 35</answer>", "claims 35"), ("<answer>12 * (51 - 48)</answer>\nSo the result is 35.", "another"),
    ("<answer>12 * (51 - 48)</answer>\nI'm not sure this uses each number once.", "hedge"),
    ("<answer>12 * (51 - 48)</answer>\nAnother option: 12 + 51 - 48", "hedge"),
    ("<answer>12 * (51 - 48) or 51 - 48 + 12</answer>", "unexpected"),
])
def test_countdown_refuses_a_right_equation_that_is_not_the_only_answer(reply, why):
    g = grade_countdown(reply, COUNTDOWN)
    assert not g.correct and why in g.problem, g


def test_tag_helpers():
    assert equation_of("\\( 12 \\div (51 - 48) \\)") == ("12 / (51 - 48)", [])
    assert decorations_removed('"**olleh**."') == "olleh"
    read = read_final_answer("<answer>5</answer>\nAnswer: 6")
    assert read.others == ("6",) and tagged_answer_problem(read, Fraction(5), lambda o: o == "5").startswith("several")
