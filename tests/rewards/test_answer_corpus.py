"""The one-final-answer rule against the labelled corpus (``tests/data/answer_corpus``): for every scored env and both
batches of endings, gym-llm's false-negative rate (correct classes) and false-positive rate (wrong classes) stay under
a stated bound, are no higher than any baseline's in any class (lm-eval strict/flexible, math-verify, TinyZero,
reasoning-gym's own scorer), and are lower overall. These are docs/verifiers.md's tables
(``python -m scripts.answer_recall --batch all``)."""

from __future__ import annotations

import pytest

from scripts.answer_recall import FLEXIBLE_RE, STRICT_RE, lm_eval_filter, rates
from tests.data.answer_corpus import CORRECT_CLASSES, WRONG_CLASSES, build

CLASS_BOUND = 0.05
"""The most gym-llm may get wrong in any one class (measured: at most 1 reply of 36, in one class)."""
OVERALL_BOUND = 0.01
"""The most gym-llm may get wrong over all correct (or all wrong) replies of an env (measured: at most 0.3%)."""


@pytest.fixture(scope="module", params=["gsm8k", "python_tool", "countdown", "reasoning_gym"])
def measured(request):
    if request.param == "reasoning_gym":
        pytest.importorskip("reasoning_gym")
    return rates(request.param, batch="all")


def test_the_rule_is_right_both_ways_in_every_class(measured):
    for cls in CORRECT_CLASSES[measured.env] + WRONG_CLASSES[measured.env]:
        errors, total = measured.counts["gym-llm"][cls]
        assert total >= 60 and errors / total <= CLASS_BOUND, (measured.env, cls, measured.misses.get(cls, [])[:3])


def test_the_rule_beats_every_baseline_in_every_class_and_overall(measured):
    baselines = [g for g in measured.counts if g != "gym-llm"]
    assert len(baselines) == 3
    for cls in CORRECT_CLASSES[measured.env] + WRONG_CLASSES[measured.env]:
        for baseline in baselines:
            assert measured.rate("gym-llm", cls) <= measured.rate(baseline, cls), (measured.env, cls, baseline)
    for kind in ("FN", "FP"):
        ours = measured.overall("gym-llm", kind)
        assert ours <= OVERALL_BOUND, (measured.env, kind, ours)
        for baseline in baselines:
            assert ours < measured.overall(baseline, kind), (measured.env, kind, baseline)


def test_the_corpus_is_labelled_both_ways_and_deterministic():
    items = build("countdown", batch="dev")
    assert items == build("countdown", batch="dev") and items != build("countdown", batch="heldout")
    assert {i.correct for i in items if i.cls in CORRECT_CLASSES["countdown"]} == {True}
    assert {i.correct for i in items if i.cls in WRONG_CLASSES["countdown"]} == {False}
    assert len({i.reply for i in items}) > 0.9 * len(items)  # the endings vary, not one reply repeated


def test_the_lm_eval_filters_are_lm_evals_own():
    """The re-implemented filters give what lm-eval 0.4.13's ``RegexFilter`` gives, on every GSM8K corpus reply."""
    extraction = pytest.importorskip("lm_eval.filters.extraction")
    replies = [i.reply for i in build("gsm8k", batch="dev")]
    for pattern, group in ((STRICT_RE, 0), (FLEXIBLE_RE, -1)):
        theirs = extraction.RegexFilter(regex_pattern=pattern.pattern, group_select=group).apply([replies], [{}])[0]
        assert [lm_eval_filter(pattern, r, group) for r in replies] == theirs
