r"""GSM8K answer checking: extract the final answer from a solution, normalise it, compare.

Extraction, in order of precedence (the last occurrence of the first kind found wins), after the last ``</think>``:

1. ``#### N`` — the GSM8K format;
2. ``\boxed{N}`` — the LaTeX convention of math-tuned models;
3. an answer statement: "the (final) answer is N", "Answer: N", a line starting ``A: N``, "N is the answer";
4. the last sentence that holds a number, closing remarks to the reader passed over: the first number after its
   last ``=``, else its first number ("So it takes 227 minutes to string all 12 racquets." -> 227), or the number
   it opens with before a justification ("**45**, since ..."). On GSM8K's own worked solutions with the ``####``
   line removed, this rule recovers the answer for 99.2% of the 8,792 train+test solutions, where "the last number
   in the text" recovers 97.2%.

The answer must then keep the one-final-answer rule (:mod:`gym_llm.rewards.final_answer`, docs/verifiers.md): its
clause states exactly one number, every other final-answer marker states the same value, and what follows it may
justify, restate, sign off or ask, but not correct, hedge or offer another answer.

Normalisation drops thousands separators, currency signs, ``%``, units and trailing words, trailing
``.0``/``.00``, LaTeX wrappers (``\text``, ``\$``, ``\frac{a}{b}``, ``\dfrac``), and the Unicode minus.
Numbers (integers, decimals, ``a/b`` fractions, mixed numbers like ``2 1/2``) compare exactly as
rationals. Anything that does not parse as a number goes to ``math-verify`` (the maintained checker for
symbolic equivalence). The numeric fast path exists because it is ~100x faster than math-verify
(measured: ~8 µs vs ~1.1 ms per check on this project's 2-core CI machine) and GSM8K references are
plain numbers; it gives the same verdict as math-verify on numbers (``tests/rewards/test_gsm8k.py``
checks the two agree on every GSM8K test reference).

Public API: :func:`score` (1.0 or 0.0), :func:`grade` (the details), :func:`extract_answer`,
:func:`reference_answer`, :func:`parse_number`, :func:`is_equivalent`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from gym_llm.core.forksafe import ForkSafeLock
from gym_llm.rewards.final_answer import (after_thinking, answer_problem, answer_token, answer_value, derived_in,
                                          is_sign_off, later_problem, number_hedged, prefix_problem, split_clause)
from gym_llm.rewards.number_text import CALCULATOR_RE, NUMBER_RE, clean_latex, parse_number, plain_value, unemphasize

__all__ = ["GRADING_TIMEOUT_S", "GSM8KGrade", "answer_problem", "extract_answer", "grade", "is_equivalent",
           "parse_number", "reference_answer", "score"]

_HASHES_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS_RE = re.compile(
    r"(?:the\s+)?(?:final\s+)?answer\s*(?:\([^()\n]*\)\s*)?(?:is|=|:)\s*[:=]?\s*([^\n]*)", re.IGNORECASE
)
# Every pattern here runs on model output in the env's thread, so each is linear in the text: no unbounded repeat
# that can cross a newline or run past its own delimiter and then backtrack (tests/rewards/test_grading_time.py
# grades replies built to make each of them quadratic).
_A_LINE_RE = re.compile(r"(?im)^[ \t]*(?:\*\*)?(?:A|Ans|Final Answer|Answer)(?:\*\*)?[ \t]*[:：][ \t]*(?:\*\*)?([^\n]*)$")
_IS_THE_ANSWER_RE = re.compile(r"\bis\s+(?:the|my|our)\s+(?:final\s+|correct\s+)?answer\b", re.IGNORECASE)
_BOXED_OPEN_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_SENTENCE_START_RE = re.compile(r"[.!?]\s|\n")
_SIGNED_CURRENCY_RE = re.compile(r"[-−]\s*\$\s*(?=\d)|\$\s*[-−]\s*(?=\d)")  # -$18, $-18: the sign stays
_SIMPLE_ANSWER_RE = re.compile(r"(?:\$\s?)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?\.?|-(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
"""One plain number, nothing else: such an answer keeps the clause rule without the full check."""
_METHOD_RANK = {"####": 2, "boxed": 1, "statement": 0}
MAX_FINAL_ANSWERS = 64
"""A completion with more final-answer statements (``####`` lines, ``\\boxed{}``, "the answer is") is wrong: no
solution needs them, and each one is checked against the others."""
_WORD_RE = re.compile(r"[^\W\d_]+")
_JUSTIFIED_RE = re.compile(r",\s*(?:since|because|as|given|which|due)\b|\(\s*[^\W\d_]|\s*—", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class GSM8KGrade:
    """The details of one check.

    Attributes:
        correct: the extracted answer equals the reference.
        extracted: the answer text found in the completion (``None`` when nothing was found).
        reference: the reference answer (the number after ``####`` in a raw GSM8K answer).
        formatted: the completion states its answer as ``#### N``.
        method: how the answer was found: ``"####"``, ``"boxed"``, ``"statement"``, ``"last_sentence"``
            or ``"none"``.
        problem: why the answer breaks the one-answer rule (:func:`answer_problem`, :func:`grade`), else ``None``.
        error: why grading could not finish (math-verify past its deadline), else ``None``; the answer is then
            graded wrong (fail closed).
    """

    correct: bool
    extracted: str | None
    reference: str
    formatted: bool
    method: str
    problem: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _Marker:
    """One final-answer marker in a completion: its kind, the answer text after it, and where both lie."""

    method: str
    answer: str
    start: int
    end: int


def reference_answer(answer: str) -> str:
    """The reference from a raw GSM8K ``answer`` field (text ending in ``#### N``) or a bare number."""
    return _reference_answer(answer if isinstance(answer, str) else str(answer))


@lru_cache(maxsize=65_536)
def _reference_answer(answer: str) -> str:
    found = _HASHES_RE.findall(answer)
    text = found[-1] if found else answer
    return text.strip().replace(",", "")


def _boxed(text: str) -> list[_Marker]:
    """Every ``\\boxed{...}`` / ``\\fbox{...}`` with its content, braces matched."""
    out, start = [], 0
    while True:
        match = _BOXED_OPEN_RE.search(text, start)
        if match is None:
            return out
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            return out
        out.append(_Marker("boxed", text[match.end(): i - 1].strip(), match.start(), i))
        start = i


def _statements(text: str) -> list[_Marker]:
    """Answer statements that hold a number: ``A: N`` lines, "the (final) answer is N", "N is the answer"."""
    lowered = text.lower()  # the patterns start with optional parts, so the engine tries each position: look first
    answers = "answer" in lowered
    patterns = ((_A_LINE_RE,) if answers or "a:" in lowered or "a：" in lowered or "ans" in lowered else ()) \
        + ((_ANSWER_IS_RE,) if answers else ())
    out = [_Marker("statement", m.group(1).strip(), m.start(), m.end()) for pattern in patterns
           for m in pattern.finditer(text)]
    for m in _IS_THE_ANSWER_RE.finditer(text) if answers else ():
        begin = max(0, m.start() - 80)
        for boundary in _SENTENCE_START_RE.finditer(text, begin, m.start()):
            begin = boundary.end()
        out.append(_Marker("statement", text[begin:m.start()].strip(), begin, m.end()))
    by_end: dict[int, _Marker] = {}  # "**Answer:** 18" matches two patterns: keep the one that starts first
    for statement in out:
        if statement.end not in by_end or statement.start < by_end[statement.end].start:
            by_end[statement.end] = statement
    return [s for s in by_end.values() if NUMBER_RE.search(unemphasize(clean_latex(s.answer)))]


def _markers(text: str) -> list[_Marker]:
    """Every final-answer marker with an answer after it, in the order they appear."""
    hashes = [_Marker("####", m.group(1).strip(), m.start(), m.end()) for m in _HASHES_RE.finditer(text)]
    boxed = _boxed(text) if "\\boxed" in text or "\\fbox" in text else []
    found = [m for m in hashes if m.answer] + [m for m in boxed if m.answer] + _statements(text)
    return sorted(found, key=lambda m: (m.start, -m.end))


def _chosen(markers: list[_Marker]) -> _Marker | None:
    """The last marker of the strongest kind present: ``####``, else ``\\boxed{}``, else a statement."""
    if not markers:
        return None
    rank = max(_METHOD_RANK[m.method] for m in markers)
    return [m for m in markers if _METHOD_RANK[m.method] == rank][-1]


def _last_sentence(text: str) -> _Marker | None:
    """Rule 4 of the module docstring: the last sentence that holds a number, closing remarks to the reader
    ("Let me know if you need help with the other 2 questions!") passed over while an earlier sentence has one."""
    plain = unemphasize(clean_latex(CALCULATOR_RE.sub("", text)))
    sentences = [s for s in _SENTENCE_SPLIT_RE.split(plain.strip()) if NUMBER_RE.search(s)]
    if not sentences:
        return None
    answered = [s for s in sentences if not is_sign_off(s)] or sentences
    sentence = answered[-1]
    first = NUMBER_RE.search(sentence)
    if not _WORD_RE.search(sentence, 0, first.start()):  # "**45**, since 15*2 = 30": the number it opens with
        clause, rest = split_clause(sentence)
        if len(_WORD_RE.findall(clause)) <= 1 and _JUSTIFIED_RE.match(rest):
            return _Marker("last_sentence", answer_token(clause) or first.group(1), 0, 0)
    if "=" in sentence:
        after = NUMBER_RE.findall(sentence.rsplit("=", 1)[-1])
        if after:
            return _Marker("last_sentence", after[0], 0, 0)
    return _Marker("last_sentence", NUMBER_RE.findall(sentence)[0], 0, 0)


def extract_answer(text: str) -> tuple[str | None, str]:
    """The final answer's text and how it was found (see the module docstring)."""
    chosen = _chosen(_markers(text))
    if chosen is None:
        chosen = _last_sentence(text)
    return (None, "none") if chosen is None else (chosen.answer, chosen.method)


def _prefix(text: str, start: int) -> str:
    """The text of a marker's line before the marker."""
    return text[text.rfind("\n", 0, start) + 1:start]


def _completion_problem(text: str, markers: list[_Marker], chosen: _Marker, value: Fraction | None) -> str | None:
    """The one-answer rule across the completion: every other final-answer marker states the same value; no hedge
    leads up to the first or the chosen one; and what follows the first one's clause keeps :func:`later_problem`."""
    if len(markers) > MAX_FINAL_ANSWERS:
        return f"several final answers ({len(markers)} final-answer statements; at most {MAX_FINAL_ANSWERS})"
    agreeing = {chosen.answer}
    for marker in markers:
        if marker.answer in agreeing:
            continue
        if answer_problem(marker.answer, later_sentences=False) is not None or answer_value(marker.answer) != value:
            shown = ", ".join(dict.fromkeys(m.answer[:20] for m in (marker, chosen)))
            return f"several final answers ({shown})"
        agreeing.add(marker.answer)
    first = markers[0] if markers else chosen
    for marker in dict.fromkeys((first, chosen)):
        hedged = prefix_problem(unemphasize(clean_latex(_prefix(text, marker.start))))
        if hedged:
            return hedged
    _, rest = split_clause(_plain(first.answer))
    later = rest + "\n" + text[first.end:]
    if not any(c.isalnum() for c in later):  # (the common case, nothing after the answer: one string scan)
        return None
    return later_problem(_plain(later), value, derived_in=lambda: derived_in(
        _plain(text[max(0, first.start - 2000):first.start]), value))


def _plain(text: str) -> str:
    return unemphasize(clean_latex(CALCULATOR_RE.sub("", text)))



GRADING_TIMEOUT_S = 5.0
"""Deadline of one math-verify check (seconds), enforced by killing its worker process (see
:mod:`gym_llm.rewards.deadline`); past it the answer is graded wrong with a ``reward_error``."""

_POOL = None
_POOL_LOCK = ForkSafeLock()


def _math_verify_pool():
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from gym_llm.rewards.deadline import WorkerPool

            _POOL = WorkerPool(preload=("math_verify",))
    return _POOL


def _math_verify_in_worker(predicted: str, reference: str) -> bool:
    """Runs in a deadline worker's main thread, where math-verify's own (signal) timeouts work too."""
    from math_verify import parse, verify

    gold = parse(f"${reference}$")
    pred = parse(predicted if "$" in predicted else f"${predicted}$")
    return bool(gold) and bool(pred) and bool(verify(gold, pred))


def _math_verify_equal(predicted: str, reference: str, timeout_s: float | None = None) -> bool:
    """Symbolic equivalence through math-verify, in a worker process killed past ``timeout_s``
    (default :data:`GRADING_TIMEOUT_S`): :class:`~gym_llm.rewards.deadline.DeadlineExceeded` then. The calling
    thread holds no lock while it waits."""
    timeout = GRADING_TIMEOUT_S if timeout_s is None else float(timeout_s)
    return bool(_math_verify_pool().call("gym_llm.rewards.gsm8k:_math_verify_in_worker", predicted, reference,
                                         timeout_s=timeout))


def _signed(text: str) -> str:
    return _SIGNED_CURRENCY_RE.sub("-", unemphasize(clean_latex(text)))


@lru_cache(maxsize=65_536)
def _reference_value(reference: str) -> Fraction | None:
    return plain_value(reference)


_SENTENCE_END_RE = re.compile(r"\.(?:\s|$)|\n")


def _final_segment(text: str) -> str:
    """An answer's first sentence, after its last ``=`` ("9 * 2 = 18. Check: ..." -> " 18")."""
    text = _SENTENCE_END_RE.split(text, maxsplit=1)[0]
    return text.rsplit("=", 1)[-1] if "=" in text else text


def _equivalent(predicted: str, pred_value: Fraction | None, reference: str, timeout_s: float | None = None) -> bool:
    ref_value = _reference_value(reference)
    if ref_value is not None:  # a numeric reference never reaches math-verify: the answer is one plain number or wrong
        return pred_value is not None and pred_value == ref_value
    from gym_llm.rewards.deadline import DeadlineExceeded

    try:
        return _math_verify_equal(predicted, reference, timeout_s)
    except DeadlineExceeded:
        raise
    except Exception:  # math-verify could not parse either side: not equivalent
        return False


def is_equivalent(predicted: str | None, reference: str, *, timeout_s: float | None = None) -> bool:
    """Whether an extracted answer equals the reference: exact rationals, else math-verify (symbolic; under a
    deadline). Equivalence only: :func:`grade` also applies the one-answer rule (:func:`answer_problem`)."""
    if predicted is None:
        return False
    predicted = _signed(_final_segment(predicted))
    value = plain_value(predicted)
    if value is None and _reference_value(reference) is not None and not NUMBER_RE.search(clean_latex(predicted)):
        return False
    if value is None or _reference_value(reference) is None:
        from gym_llm.rewards.deadline import DeadlineExceeded

        try:
            return _math_verify_equal(predicted, reference, timeout_s)
        except DeadlineExceeded:
            raise
        except Exception:
            return False
    return value == _reference_value(reference)


def _located(completion: str) -> tuple[str, list[_Marker], _Marker | None]:
    """The text read (after the last ``</think>``, unless only the reasoning states an answer), its markers and the
    chosen final answer (a marker, else the last sentence with a number)."""
    for text in dict.fromkeys((after_thinking(completion)[0], completion)):
        markers = _markers(text)
        chosen = _chosen(markers) or _last_sentence(text)
        if chosen is not None:
            return text, markers, chosen
    return completion, [], None


def grade(completion: str, answer: str, *, timeout_s: float | None = None) -> GSM8KGrade:
    """Check ``completion`` against ``answer`` (a raw GSM8K answer field or a bare number).

    The final answer is extracted (module docstring) and must keep the one-answer rule (:func:`answer_problem` on its
    clause, :func:`~gym_llm.rewards.final_answer.later_problem` on what follows, and every other final-answer marker
    stating the same value; else it is wrong and ``problem`` says why), then equals the reference as an exact
    rational, or through math-verify when the reference is not a plain number. math-verify runs under a hard deadline
    (``timeout_s``, default :data:`GRADING_TIMEOUT_S`) in a worker process: past it the answer is wrong and ``error``
    says so.
    """
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}.")
    reference = reference_answer(answer)
    text, markers, chosen = _located(completion)
    if chosen is None:
        return GSM8KGrade(False, None, reference, False, "none")
    extracted, method = chosen.answer, chosen.method
    if _reference_value(reference) is None:  # a symbolic reference (other datasets): math-verify decides, no rule
        segment = _signed(_final_segment(extracted))
        return _compared(extracted, method, reference, segment, plain_value(segment), timeout_s)
    if _SIMPLE_ANSWER_RE.fullmatch(extracted):  # the common case ("18", "$1,234.50", "-7"): keeps the clause rule
        problem, value = None, plain_value(_signed(extracted))
    else:
        problem = answer_problem(extracted, later_sentences=False)
        value = answer_value(extracted) if problem is None else None
    if problem is None and method != "last_sentence":
        problem = _completion_problem(text, markers, chosen, value)
    elif problem is None:
        problem = _last_sentence_problem(text, extracted, value)
    if problem is not None:
        return GSM8KGrade(False, extracted, reference, False, method, problem=problem)
    return _compared(extracted, method, reference, str(value), value, timeout_s)


def _last_sentence_problem(text: str, extracted: str, value: Fraction | None) -> str | None:
    """A hedge in the answer's sentence, or a correction after it, when no marker states the answer."""
    sentences = _SENTENCE_SPLIT_RE.split(_plain(text).strip())
    at = max((i for i, s in enumerate(sentences) if extracted in s and not is_sign_off(s)), default=len(sentences) - 1)
    sentence = sentences[at]
    return number_hedged(sentence, extracted) or later_problem("\n".join(sentences[at + 1:]), value)


def _compared(extracted: str, method: str, reference: str, segment: str, value: Fraction | None,
              timeout_s: float | None) -> GSM8KGrade:
    try:
        correct = _equivalent(segment, value, reference, timeout_s)
        error = None
    except Exception as e:  # DeadlineExceeded, or the worker died: fail closed
        correct, error = False, f"{type(e).__name__}: {e}"
    return GSM8KGrade(correct=correct, extracted=extracted, reference=reference,
                      formatted=method == "####" and value is not None, method=method, error=error)


def score(completion: str, answer: str) -> float:
    """1.0 if the completion's final answer equals ``answer``, else 0.0.

    >>> score("She sells 9 eggs at $2 each, so she makes 18 dollars. #### 18", "... #### 18")
    1.0
    >>> score("The answer is $1,000.", "1000"), score("A: 26", "#### 27")
    (1.0, 0.0)
    >>> score("#### 18\\nLet me know if you need help with the other 2 questions!", "18")
    1.0
    """
    return 1.0 if grade(completion, answer).correct else 0.0
