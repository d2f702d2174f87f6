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

__all__ = ["GSM8KGrade", "extract_answer", "grade", "is_equivalent", "parse_number", "reference_answer", "score"]

_NUMBER_RE = re.compile(
    r"(?<![\w.])([-−]?\d+\s+\d+\s*/\s*\d+(?![\d.,])"  # a mixed number: 2 1/2
    r"|[-−]?(?:\d{1,3}(?:,\d{3})+(?![\d])|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"  # 1,234.5  3/4
    r"|[-−]?\.\d+)"  # .5
)
_HASHES_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS_RE = re.compile(
    r"(?:the\s+)?(?:final\s+)?answer\s*(?:\([^)\n]*\)\s*)?(?:is|=|:)\s*[:=]?\s*([^\n]*)", re.IGNORECASE
)
_CALCULATOR_RE = re.compile(r"<<[^>\n]*>>")  # GSM8K-style calculator annotations: <<9*2=18>>
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_A_LINE_RE = re.compile(r"(?im)^\s*(?:\*\*)?(?:A|Ans|Final Answer|Answer)(?:\*\*)?\s*[:：]\s*(?:\*\*)?([^\n]*)$")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")


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
    """

    correct: bool
    extracted: str | None
    reference: str
    formatted: bool
    method: str


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
    statements = [s for s in statements if _NUMBER_RE.search(_clean(s))]
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
    text = _clean(_CALCULATOR_RE.sub("", text))
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


def _clean(text: str) -> str:
    """LaTeX wrappers and Unicode minus signs rewritten to plain text (cheap when there are none)."""
    if not any(marker in text for marker in _LATEX_OR_DASH):
        return text
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


_MV_LOCK = threading.Lock()


def _math_verify_equal(predicted: str, reference: str) -> bool:
    """Symbolic equivalence through math-verify (imported lazily: it loads sympy)."""
    from math_verify import parse, verify

    in_main = threading.current_thread() is threading.main_thread()
    # math-verify's own timeouts use signal.alarm, which only works in the main thread.
    kwargs = {} if in_main else {"parsing_timeout": None}
    gold = parse(f"${reference}$", **kwargs)
    pred = parse(predicted if "$" in predicted else f"${predicted}$", **kwargs)
    if not gold or not pred:
        return False
    with _MV_LOCK:  # sympy caches are not thread-safe
        return bool(verify(gold, pred, **({} if in_main else {"timeout_seconds": None})))


_SENTENCE_END_RE = re.compile(r"\.(?:\s|$)|\n")


def _final_segment(text: str) -> str:
    """An answer's first sentence, after its last ``=`` ("9 * 2 = 18. Check: ..." -> " 18")."""
    text = _SENTENCE_END_RE.split(text, maxsplit=1)[0]
    return text.rsplit("=", 1)[-1] if "=" in text else text


def _equivalent(predicted: str, pred_value: Fraction | None, reference: str) -> bool:
    ref_value = _reference_value(reference)
    if ref_value is not None and pred_value is not None:
        return pred_value == ref_value
    try:
        return _math_verify_equal(predicted, reference)
    except Exception:  # math-verify could not parse either side: not equivalent
        return False


def is_equivalent(predicted: str | None, reference: str) -> bool:
    """Whether an extracted answer equals the reference: exact rationals, else math-verify."""
    if predicted is None:
        return False
    predicted = _final_segment(predicted)
    return _equivalent(predicted, _plain_value(predicted), reference)


def grade(completion: str, answer: str) -> GSM8KGrade:
    """Check ``completion`` against ``answer`` (a raw GSM8K answer field or a bare number)."""
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}.")
    reference = reference_answer(answer)
    extracted, method = extract_answer(completion)
    if extracted is None:
        return GSM8KGrade(False, None, reference, False, method)
    segment = _final_segment(extracted)
    value = _plain_value(segment)
    return GSM8KGrade(
        correct=_equivalent(segment, value, reference),
        extracted=extracted,
        reference=reference,
        formatted=method == "####" and value is not None,
        method=method,
    )


def score(completion: str, answer: str) -> float:
    """1.0 if the completion's final answer equals ``answer``, else 0.0.

    >>> score("She sells 9 eggs at $2 each, so she makes 18 dollars. #### 18", "... #### 18")
    1.0
    >>> score("The answer is $1,000.", "1000"), score("A: 26", "#### 27")
    (1.0, 0.0)
    """
    return 1.0 if grade(completion, answer).correct else 0.0
