"""GSM8K answer checking: extraction styles, normalisation, math-verify agreement."""

from __future__ import annotations

import json
from pathlib import Path
from fractions import Fraction

import pytest

from gym_llm.rewards.gsm8k import (
    _math_verify_equal,
    extract_answer,
    grade,
    is_equivalent,
    parse_number,
    reference_answer,
    score,
)

RAW_ANSWER = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18"

CASES = [
    # (completion, reference, expected score)
    ("She makes 9 * 2 = 18 dollars.\n#### 18", RAW_ANSWER, 1.0),
    ("#### 18.00", "18", 1.0),
    ("#### $18", "18", 1.0),
    ("####18", "18", 1.0),
    ("So the answer is \\boxed{18}.", "18", 1.0),
    ("\\boxed{\\$18}", "18", 1.0),
    ("\\boxed{18 \\text{ dollars}}", "18", 1.0),
    ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
    ("The answer is $1,234.", "1234", 1.0),
    ("The final answer is: 26 apples", "26", 1.0),
    ("Q: How many?\nA: 26", "26", 1.0),
    ("A: 26", "27", 0.0),
    ("**Answer:** 42", "42", 1.0),
    ("Answer: 7.5 hours", "7.5", 1.0),
    ("It costs 2 1/2 dollars.", "2.5", 1.0),
    ("45 + 110 + 72 = 227 minutes.  So, it will take Andy 227 minutes to string all 12 racquets.", "227", 1.0),
    ("Thus, there are a total of 9 + 6 = <<9+6=15>>15 liters of water out of the 24 liters.", "15", 1.0),
    ("Therefore, the answer (arabic numerals) is 40.", "40", 1.0),
    ("The temperature dropped to −5 degrees. The answer is −5.", "-5", 1.0),
    ("That is 25% of the total, so the answer is 25%.", "25", 1.0),
    ("First 3 + 4 = 7, then 7 * 2 = 14. So she has 14 marbles left.", "14", 1.0),
    ("First 3 + 4 = 7, then 7 * 2 = 14. So she has 14 marbles left.", "7", 0.0),
    ("The answer is 18. Checking: 18 + 2 = 20.", "18", 1.0),  # the statement wins over the last number
    ("#### 18\nThe answer is 20", "18", 0.0),  # two final answers: the one-answer rule (docs/verifiers.md)
    ("#### 18\nThe answer is 18", "18", 1.0),  # the same answer twice is one answer
    ("I don't know.", "18", 0.0),
    ("", "18", 0.0),
    ("#### 1,000,000", "1000000", 1.0),
    ("#### 0.5", "1/2", 1.0),
    ("The answer is 10.", "100", 0.0),
]


@pytest.mark.parametrize("completion,reference,expected", CASES)
def test_score_styles(completion, reference, expected):
    assert score(completion, reference) == expected


def test_grade_details_and_format():
    g = grade("She makes 18 dollars.\n#### 18", RAW_ANSWER)
    assert g.correct and g.formatted and g.method == "####" and g.extracted == "18" and g.reference == "18"
    g = grade("The answer is 18.", "18")
    assert g.correct and not g.formatted and g.method == "statement"
    assert grade("no numbers here", "3").method == "none"


def test_reference_answer_forms():
    assert reference_answer(RAW_ANSWER) == "18"
    assert reference_answer("1,234") == "1234"
    assert reference_answer("#### 1,234") == "1234"
    assert reference_answer(42) == "42"


def test_parse_number():
    assert parse_number("$1,234.50 per month") == Fraction(2469, 2)
    assert parse_number("\\frac{3}{4}") == Fraction(3, 4)
    assert parse_number("2 1/2 cups") == Fraction(5, 2)
    assert parse_number("-7") == -7
    assert parse_number("1/0") is None
    assert parse_number("none") is None
    assert parse_number("12,34") == 12  # not a thousands group: the first number is 12


def test_non_numeric_answers_go_to_math_verify():
    assert is_equivalent("\\sqrt{4}", "2")
    assert not is_equivalent("\\sqrt{5}", "2")
    assert extract_answer("\\boxed{x^2}") == ("x^2", "boxed")


def test_rejects_non_string_completion():
    with pytest.raises(TypeError, match="completion must be a str"):
        grade(18, "18")


def test_fast_path_agrees_with_math_verify_on_every_gsm8k_reference(gsm8k_test_file):
    """The numeric fast path gives math-verify's verdict on GSM8K's references (and on nearby wrong answers)."""
    rows = [json.loads(line) for line in gsm8k_test_file.read_text().splitlines()]
    assert len(rows) == 1319
    disagreements = []
    for row in rows[::4]:
        ref = reference_answer(row["answer"])
        for candidate in (ref, str(Fraction(ref) + 1)):
            fast = parse_number(candidate) == parse_number(ref)
            if fast != _math_verify_equal(candidate, ref):
                disagreements.append((candidate, ref))
    assert disagreements == []


def test_scores_gsm8k_reference_solutions_as_correct(gsm8k_test_file):
    """GSM8K's own worked solutions, given as completions, score 1.0 against their answers."""
    rows = [json.loads(line) for line in gsm8k_test_file.read_text().splitlines()]
    assert all(score(row["answer"], row["answer"]) == 1.0 for row in rows)
    # without the '#### N' line the checker falls back to the last sentence's number
    stripped = [(row["answer"].rsplit("####", 1)[0], row["answer"]) for row in rows]
    accuracy = sum(score(s, a) for s, a in stripped) / len(stripped)
    assert accuracy > 0.985


MODEL_SOLUTIONS = Path(__file__).resolve().parents[1] / "data" / "gsm8k_model_solutions.jsonl"


def _model_solutions() -> list[dict]:
    return [json.loads(line) for line in MODEL_SOLUTIONS.read_text(encoding="utf-8").splitlines()]


def test_agrees_with_upstream_labels_on_real_model_solutions():
    """Real GPT-3 solutions (OpenAI grade-school-math, MIT) ending in ``A: N``, with OpenAI's ``is_correct``."""
    rows = _model_solutions()
    assert len(rows) == 43 and 0 < sum(r["is_correct"] for r in rows) < 43
    mismatches = [(r["solution"][-60:], r["reference"]) for r in rows
                  if (score(r["solution"], r["reference"]) == 1.0) != r["is_correct"]]
    assert mismatches == []


def _restyled(value: Fraction) -> list[tuple[str, str]]:
    """The final answer ``value`` in the answer styles models write, with the scorer's method for each."""
    plain = str(value.numerator) if value.denominator == 1 else f"{float(value):g}"
    grouped = f"{value.numerator:,}" if value.denominator == 1 else plain
    styles = [
        (f"#### {plain}", "####"),
        (f"####{grouped}", "####"),
        (f"So the answer is $\\boxed{{{plain}}}$.", "boxed"),
        (f"The final answer is \\boxed{{\\$ {grouped}}}", "boxed"),
        (f"The answer is {plain}.", "statement"),
        (f"Therefore, the answer is {grouped} in total.", "statement"),
        (f"**Answer:** {grouped}", "statement"),
        (f"A: ${grouped}", "statement"),
        (f"Final Answer: {plain} units", "statement"),
    ]
    if value.denominator == 1:
        styles.append((f"A: ${grouped}.00", "statement"))
    else:  # a non-integer answer also as a fraction
        styles += [(f"\\boxed{{\\frac{{{value.numerator}}}{{{value.denominator}}}}}", "boxed"),
                   (f"The answer is {value.numerator}/{value.denominator}.", "statement")]
    return styles


def test_agrees_with_upstream_labels_in_other_answer_styles():
    """The same solutions with their ``A: N`` line rewritten in other styles (``#### N``, ``\\boxed{}``,
    "The answer is N", currency, thousands separators, units, fractions): the final answer's value does
    not change, so neither does the label."""
    checked, mismatches = 0, []
    for row in _model_solutions():
        body, sep, answer = row["solution"].rpartition("\nA: ")
        if not sep:  # the one solution cut off before its answer
            continue
        value = Fraction(answer.replace(",", ""))
        for final_line, method in _restyled(value):
            g = grade(f"{body}\n{final_line}", row["reference"])
            checked += 1
            if (g.correct, g.method) != (row["is_correct"], method):
                mismatches.append((final_line, row["reference"], row["is_correct"], g))
    assert mismatches == [] and checked >= 42 * 9
