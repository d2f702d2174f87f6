r"""GSM8K answer checking: extract the final answer from a solution, normalise it, compare.

Extraction, in order of precedence (the last occurrence of the first kind found wins):

1. ``#### N`` — the GSM8K format;
2. ``\boxed{N}`` — the LaTeX convention of math-tuned models;
3. an answer statement: "the (final) answer is N", "Answer: N", a line starting ``A: N``;
4. the last sentence that holds a number: the first number after its last ``=``, else its first
   number ("So it takes 227 minutes to string all 12 racquets." -> 227). On GSM8K's own worked
   solutions with the ``####`` line removed, this rule recovers the answer for 99.1% of the 8,792
   train+test solutions, where "the last number in the text" recovers 97.2%.

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
import threading
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

__all__ = ["GRADING_TIMEOUT_S", "GSM8KGrade", "answer_problem", "extract_answer", "grade", "is_equivalent",
           "parse_number", "reference_answer", "score"]

_NUMBER_RE = re.compile(
    r"(?<![\w.])([-−]?\d+\s+\d+\s*/\s*\d+(?![\d.,])"  # a mixed number: 2 1/2
    r"|[-−]?(?:\d{1,3}(?:,\d{3})+(?![\d])|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"  # 1,234.5  3/4
    r"|[-−]?\.\d+)"  # .5
)
_HASHES_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS_RE = re.compile(
    r"(?:the\s+)?(?:final\s+)?answer\s*(?:\([^()\n]*\)\s*)?(?:is|=|:)\s*[:=]?\s*([^\n]*)", re.IGNORECASE
)
# Every pattern here runs on model output in the env's thread, so each is linear in the text: no unbounded repeat
# that can cross a newline or run past its own delimiter and then backtrack (tests/rewards/test_grading_time.py
# grades replies built to make each of them quadratic).
_CALCULATOR_RE = re.compile(r"<<[^<>\n]*>>")  # GSM8K-style calculator annotations: <<9*2=18>>
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_A_LINE_RE = re.compile(r"(?im)^[ \t]*(?:\*\*)?(?:A|Ans|Final Answer|Answer)(?:\*\*)?[ \t]*[:：][ \t]*(?:\*\*)?([^\n]*)$")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{([^{}]*)\}")
_SIGNED_CURRENCY_RE = re.compile(r"[-−]\s*\$\s*(?=\d)|\$\s*[-−]\s*(?=\d)")  # -$18, $-18: the sign stays
_NEGATION_RE = re.compile(
    r"!=|≠|=/=|\\neq?\b|\\not\b|[<>≤≥≈~]|\\(?:approx|sim|leq?|geq?|lt|gt)\b"
    r"|\b(?:not|no|never|isn'?t|neither|nor|except|other than|instead of|rather than|about|approximately|around"
    r"|roughly|nearly|almost|at least|at most|more than|less than|fewer than|greater than|up to|between|over|under)\b",
    re.IGNORECASE,
)
_MULTIPLIER_RE = re.compile(
    r"\d(?:\s*[eE][+-]?\d|(?:k|K|M|B|bn|Bn|BN)\b|\s*(?:x|×|\*|\\times|\\cdot)\s*10\s*\^"
    r"|\s*(?:thousand|million|billion|trillion|hundred|dozen|grand|lakh|crore)s?\b)",
    re.IGNORECASE,
)
_OPERATOR_RE = re.compile(r"\*|[+×·÷^√]|\\(?:times|cdot|div|sqrt|pm|mp|lor|land|vee|wedge|cup|cap)\b|\bsqrt\b"
                          r"|(?<=[\d)}])\s*[-−–]\s*(?=[\d($\\])")
_SIMPLE_ANSWER_RE = re.compile(r"(?:\$\s?)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?\.?|-(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
"""One plain number, nothing else: such an answer keeps the one-answer rule without the full check."""
_EMPHASIS_RE = re.compile(  # markdown **18**, *18*, __18__, _18_: the text between never holds its delimiter's char
    r"\*\*(?=\S)([^*\n]+?)(?<=\S)\*\*|\*(?=\S)([^*\n]+?)(?<=\S)\*|__(?=\S)([^_\n]+?)(?<=\S)__|_(?=\S)([^_\n]+?)(?<=\S)_")
_HEDGE_RE = re.compile(
    r"\b(?:approx\.?|or (?:more|less|so|fewer|above|below)|rounded|estimated?|maybe|perhaps|probably|possibly"
    r"|likely|give or take|plus or minus|circa|ca\.|then again|or rather|on second thought)(?!\w)|(?<=\d)\s*-?ish\b", re.IGNORECASE)
_MALFORMED_NUMBER_RE = re.compile(r"(?<![\d.])\d+(?:\.\d+){2,}|(?<![\d_])\d+(?:_+\d+)+")  # 18.0.0, 18_19: not one number


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
        problem: why the answer breaks the one-answer rule (:func:`answer_problem`), else ``None``.
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


def reference_answer(answer: str) -> str:
    """The reference from a raw GSM8K ``answer`` field (text ending in ``#### N``) or a bare number."""
    return _reference_answer(answer if isinstance(answer, str) else str(answer))


@lru_cache(maxsize=65_536)
def _reference_answer(answer: str) -> str:
    found = _HASHES_RE.findall(answer)
    text = found[-1] if found else answer
    return text.strip().replace(",", "")


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1: i]
    return None


def extract_answer(text: str) -> tuple[str | None, str]:
    """The final answer's text and how it was found (see the module docstring)."""
    found = _HASHES_RE.findall(text)
    if found and found[-1].strip():
        return found[-1].strip(), "####"
    boxed = _last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip(), "boxed"
    statements = _A_LINE_RE.findall(text) + _ANSWER_IS_RE.findall(text)
    statements = [s for s in statements if _NUMBER_RE.search(_unemphasize(_clean(s)))]
    if statements:
        # the statement that comes last in the text
        last = max(statements, key=lambda s: text.rfind(s))
        return last.strip(), "statement"
    number = _last_sentence_number(text)
    if number is not None:
        return number, "last_sentence"
    return None, "none"


def _last_sentence_number(text: str) -> str | None:
    """Rule 4 of the module docstring."""
    text = _unemphasize(_clean(_CALCULATOR_RE.sub("", text)))
    for sentence in reversed(_SENTENCE_SPLIT_RE.split(text.strip())):
        numbers = _NUMBER_RE.findall(sentence)
        if not numbers:
            continue
        if "=" in sentence:
            after = _NUMBER_RE.findall(sentence.rsplit("=", 1)[-1])
            if after:
                return after[0]
        return numbers[0]
    return None


_LATEX_OR_DASH = ("\\", "−", "–")


def _unemphasize(text: str) -> str:
    """Markdown emphasis removed, nested (``***18***``, ``**_18_**``) included: at most three rounds."""
    for _ in range(3):
        if "*" not in text and "_" not in text:
            break
        text, n = _EMPHASIS_RE.subn(lambda m: next(g for g in m.groups() if g is not None), text)
        if not n:
            break
    return text


def _clean(text: str) -> str:
    """LaTeX wrappers and Unicode minus signs rewritten to plain text (cheap when there are none)."""
    if not any(marker in text for marker in _LATEX_OR_DASH):
        return text
    text = _BOXED_RE.sub(r"\1", text)
    text = _FRAC_RE.sub(r"\1/\2", text)
    text = _TEXT_RE.sub(r" \1", text)
    for old, new in (("\\$", "$"), ("\\%", "%"), ("\\,", ""), ("\\!", ""), ("\\ ", " "), ("−", "-"), ("–", "-")):
        text = text.replace(old, new)
    return text


def _to_fraction(token: str) -> Fraction | None:
    """A matched number token ("1,234.5", "-3/4", "2 1/2") as an exact rational."""
    token = token.replace(",", "")
    try:
        if "/" in token:
            head, den = token.rsplit("/", 1)
            parts = head.split()
            if len(parts) == 2:  # mixed number
                whole, num = parts
                value = abs(int(whole)) + Fraction(int(num), int(den))
                return -value if whole.startswith("-") else value
            return Fraction(head.strip()) / Fraction(den.strip())
        if "." in token:
            return Fraction(token)
        return Fraction(int(token))
    except (ValueError, ZeroDivisionError):
        return None


def _first_number(cleaned: str) -> Fraction | None:
    match = _NUMBER_RE.search(cleaned)
    return None if match is None else _to_fraction(match.group(1))


def parse_number(text: str | None) -> Fraction | None:
    """The first number in ``text`` as an exact rational, or ``None``.

    >>> parse_number("$1,234.50 per month"), parse_number(r"\\frac{3}{4}"), parse_number("2 1/2 cups")
    (Fraction(2469, 2), Fraction(3, 4), Fraction(5, 2))
    """
    return None if text is None else _first_number(_clean(text))


def _plain_value(text: str) -> Fraction | None:
    """The number in ``text`` if it is a number with words or units around it; ``None`` for an
    expression that needs a CAS (powers, roots, leftover LaTeX) or no number at all."""
    cleaned = _clean(text)
    if any(c in cleaned for c in "\\^{}") or "sqrt" in cleaned:
        return None
    return _first_number(cleaned)


@lru_cache(maxsize=65_536)
def _reference_value(reference: str) -> Fraction | None:
    return _plain_value(reference)


GRADING_TIMEOUT_S = 5.0
"""Deadline of one math-verify check (seconds), enforced by killing its worker process (see
:mod:`gym_llm.rewards.deadline`); past it the answer is graded wrong with a ``reward_error``."""

_POOL = None
_POOL_LOCK = threading.Lock()


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


_SENTENCE_END_RE = re.compile(r"\.(?:\s|$)|\n")


def _first_sentence(text: str) -> str:
    return _SENTENCE_END_RE.split(text, maxsplit=1)[0]


def _final_segment(text: str) -> str:
    """An answer's first sentence, after its last ``=`` ("9 * 2 = 18. Check: ..." -> " 18")."""
    text = _first_sentence(text)
    return text.rsplit("=", 1)[-1] if "=" in text else text


def answer_problem(answer: str, *, later_sentences: bool = True) -> str | None:
    """Why an extracted final answer breaks the one-answer rule, or ``None`` if it keeps it.

    The rule (the same for every extraction method and for the numeric and math-verify paths): the answer's first
    sentence, after its last ``=``, states **exactly one number**, with no negation or comparison (``not 18``,
    ``!= 18``, ``about 18``, ``> 18``), no operator (``18**2``, ``9^{9^{9}}``, ``\\sqrt{324}``, ``20 - 2``,
    ``19 \\lor 18``) and no unit multiplier (``18e3``, ``18k``, ``18 thousand``); a sign before a currency sign
    counts (``-$18`` is -18). Thousands separators, currency, ``%``, units and words around the number,
    ``\\frac{a}{b}``, ``a/b`` and mixed numbers, ``\\boxed{}`` and ``\\text{}`` are fine. Also wrong: a hedge
    anywhere in the answer (``18 approx``, ``18ish``, ``18 or more``, ``18 (rounded)``, ``maybe``), something that is
    not one number (``18.0.0``, ``18_19``), no number at all (``eighteen``: write it in digits), and — with
    ``later_sentences`` (a ``####`` line or ``\\boxed{}``, which hold the answer alone) — a later sentence with a
    different number (``18. Or 19.``). :func:`grade` adds the rules across the whole completion: every ``####`` line
    (or every ``\\boxed{}``) states the same value, and no number follows the last ``####`` line that differs from
    it.

    >>> answer_problem("$70,000"), answer_problem("18 or 19"), answer_problem("not 18")
    (None, 'several candidate numbers (18, 19)', 'a negation or comparison (not)')
    """
    cleaned = _unemphasize(_clean(_CALCULATOR_RE.sub("", answer)))
    malformed = _MALFORMED_NUMBER_RE.search(cleaned)
    if malformed:
        return f"not one number ({malformed.group(0)})"
    sentence = _SIGNED_CURRENCY_RE.sub("-", _first_sentence(cleaned))
    negation = _NEGATION_RE.search(sentence) or _HEDGE_RE.search(cleaned)
    if negation:
        return f"a negation or comparison ({negation.group(0).strip()})"
    tail = sentence.rsplit("=", 1)[-1] if "=" in sentence else sentence
    multiplier = _MULTIPLIER_RE.search(tail)
    if multiplier:
        return f"a unit multiplier ({multiplier.group(0)[1:].strip()})"
    operator = _OPERATOR_RE.search(tail)
    if operator:
        return f"an operator ({operator.group(0).strip()})"
    numbers = _NUMBER_RE.findall(tail)
    if len(numbers) > 1:
        return f"several candidate numbers ({', '.join(n.strip() for n in numbers[:4])})"
    if not numbers:
        return "no number (write the answer in digits)"
    if not later_sentences:
        return None
    value = _to_fraction(numbers[0])
    rest = cleaned[len(_first_sentence(cleaned)):]  # later sentences may repeat the answer, not change it
    others = [n for n in _NUMBER_RE.findall(rest) if _to_fraction(n) != value]
    if others:
        return f"several candidate numbers ({numbers[0].strip()}, {', '.join(n.strip() for n in others[:3])})"
    return None


def _boxed_contents(text: str) -> list[str]:
    """Every ``\\boxed{...}`` / ``\\fbox{...}`` content, braces matched."""
    out, start = [], 0
    while True:
        match = re.compile(r"\\(?:boxed|fbox)\s*\{").search(text, start)
        if match is None:
            return out
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            return out
        out.append(text[match.end(): i - 1])
        start = i


def _several_final_answers(completion: str, method: str, value: Fraction | None) -> str | None:
    """The one-answer rule across the whole completion: every ``####`` line (or ``\\boxed{}``, when that is how
    the answer was found) must state the same value, and text after the last ``####`` line may not add a number."""
    if method == "####":
        end = completion.find("\n", completion.rfind("####"))
        after = "" if end < 0 else completion[end:]
        if any(c.isdigit() for c in after):  # (the common case, nothing after the line, costs two string scans)
            after = _CALCULATOR_RE.sub("", _clean(after))
            stray = [n for n in _NUMBER_RE.findall(after) if _to_fraction(n) != value]
            if stray:
                return f"another number after the final answer ({', '.join(n.strip() for n in stray[:3])})"
        if completion.count("####") == 1:
            return None
        answers = [a.strip() for a in _HASHES_RE.findall(completion) if a.strip()]
    elif method == "boxed":
        answers = [a.strip() for a in _boxed_contents(completion) if a.strip()]
    else:
        return None
    values = {_plain_value(_signed(_final_segment(a))) for a in answers}
    if len(values) > 1:
        shown = ", ".join(a[:20] for a in dict.fromkeys(answers))
        return f"several final answers ({shown})"
    return None


def _signed(text: str) -> str:
    return _SIGNED_CURRENCY_RE.sub("-", _unemphasize(_clean(text)))


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
    value = _plain_value(predicted)
    if value is None and _reference_value(reference) is not None and not _NUMBER_RE.search(_clean(predicted)):
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


def grade(completion: str, answer: str, *, timeout_s: float | None = None) -> GSM8KGrade:
    """Check ``completion`` against ``answer`` (a raw GSM8K answer field or a bare number).

    The final answer is extracted (module docstring), must keep the one-answer rule (:func:`answer_problem`;
    else it is wrong and ``problem`` says why), then equals the reference as an exact rational, or through
    math-verify when either side is not a plain number. math-verify runs under a hard deadline (``timeout_s``,
    default :data:`GRADING_TIMEOUT_S`) in a worker process: past it the answer is wrong and ``error`` says so.
    """
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}.")
    reference = reference_answer(answer)
    extracted, method = extract_answer(completion)
    if extracted is None:
        return GSM8KGrade(False, None, reference, False, method)
    numeric = _reference_value(reference) is not None
    if _SIMPLE_ANSWER_RE.fullmatch(extracted):  # the common case ("18", "$1,234.50", "-7"): keeps the rule as is
        problem, segment = None, extracted
    else:  # the rule is for numeric references (GSM8K's); a symbolic reference goes to math-verify as it is
        # a "####" line or a \boxed{} holds the answer alone; an answer statement may go on with its checking
        problem = answer_problem(extracted, later_sentences=method in ("####", "boxed")) if numeric else None
        segment = _signed(_final_segment(extracted))
    value = _plain_value(segment)
    if problem is None and numeric:
        problem = _several_final_answers(completion, method, value)
    if problem is not None:
        return GSM8KGrade(False, extracted, reference, False, method, problem=problem)
    try:
        correct = _equivalent(segment, value, reference, timeout_s)
        error = None
    except Exception as e:  # DeadlineExceeded, or the worker died: fail closed
        correct, error = False, f"{type(e).__name__}: {e}"
    return GSM8KGrade(
        correct=correct,
        extracted=extracted,
        reference=reference,
        formatted=method == "####" and value is not None,
        method=method,
        error=error,
    )


def score(completion: str, answer: str) -> float:
    """1.0 if the completion's final answer equals ``answer``, else 0.0.

    >>> score("She sells 9 eggs at $2 each, so she makes 18 dollars. #### 18", "... #### 18")
    1.0
    >>> score("The answer is $1,000.", "1000"), score("A: 26", "#### 27")
    (1.0, 0.0)
    """
    return 1.0 if grade(completion, answer).correct else 0.0
