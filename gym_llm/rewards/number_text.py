r"""Reading numbers out of model text: the number pattern, LaTeX and markdown unwrapped, exact rationals.

Shared by the GSM8K rule (:mod:`gym_llm.rewards.gsm8k`), the one-final-answer rule
(:mod:`gym_llm.rewards.final_answer`) and the ``<answer>``-tag envs. Every pattern here runs on model output in the
env's thread, so each is linear in the text: no unbounded repeat that can cross a newline or run past its own
delimiter and then backtrack (``tests/rewards/test_grading_time.py`` grades replies built to make each quadratic).

>>> parse_number("$1,234.50 per month"), parse_number(r"\frac{3}{4}"), parse_number("2 1/2 cups")
(Fraction(2469, 2), Fraction(3, 4), Fraction(5, 2))
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["CALCULATOR_RE", "NUMBER_RE", "clean_latex", "first_number", "parse_number", "plain_value", "to_fraction",
           "unemphasize"]

NUMBER_RE = re.compile(
    r"(?<![\w.])([-−]?\d+\s+\d+\s*/\s*\d+(?![\d.,])"  # a mixed number: 2 1/2
    r"|[-−]?(?:\d{1,3}(?:,\d{3})+(?![\d])|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"  # 1,234.5  3/4
    r"|[-−]?\.\d+)"  # .5
)
"""One number token: an integer, a decimal, ``1,234`` thousands groups, ``a/b`` or a mixed number ``2 1/2``."""
CALCULATOR_RE = re.compile(r"<<[^<>\n]*>>")
"""GSM8K-style calculator annotations: ``<<9*2=18>>``."""
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{([^{}]*)\}")
_EMPHASIS_RE = re.compile(  # markdown **18**, *18*, __18__, _18_: the text between never holds its delimiter's char
    r"\*\*(?=\S)([^*\n]+?)(?<=\S)\*\*|\*(?=\S)([^*\n]+?)(?<=\S)\*|__(?=\S)([^_\n]+?)(?<=\S)__|_(?=\S)([^_\n]+?)(?<=\S)_")
_LATEX_OR_DASH = ("\\", "−", "–")


def unemphasize(text: str) -> str:
    """Markdown emphasis removed, nested (``***18***``, ``**_18_**``) included: at most three rounds."""
    for _ in range(3):
        if "*" not in text and "_" not in text:
            break
        text, n = _EMPHASIS_RE.subn(lambda m: next(g for g in m.groups() if g is not None), text)
        if not n:
            break
    return text


def clean_latex(text: str) -> str:
    """LaTeX wrappers and Unicode minus signs rewritten to plain text (cheap when there are none)."""
    if not any(marker in text for marker in _LATEX_OR_DASH):
        return text
    text = _BOXED_RE.sub(r"\1", text)
    text = _FRAC_RE.sub(r"\1/\2", text)
    text = _TEXT_RE.sub(r" \1", text)
    for old, new in (("\\$", "$"), ("\\%", "%"), ("\\,", ""), ("\\!", ""), ("\\ ", " "), ("−", "-"), ("–", "-")):
        text = text.replace(old, new)
    return text


def to_fraction(token: str) -> Fraction | None:
    """A matched number token ("1,234.5", "-3/4", "2 1/2") as an exact rational."""
    token = token.replace(",", "").replace("−", "-")
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


def first_number(cleaned: str) -> Fraction | None:
    """The first number token of already-cleaned text, as a rational."""
    match = NUMBER_RE.search(cleaned)
    return None if match is None else to_fraction(match.group(1))


def parse_number(text: str | None) -> Fraction | None:
    """The first number in ``text`` as an exact rational, or ``None``."""
    return None if text is None else first_number(clean_latex(text))


def plain_value(text: str) -> Fraction | None:
    """The number in ``text`` if it is a number with words or units around it; ``None`` for an
    expression that needs a CAS (powers, roots, leftover LaTeX) or no number at all."""
    cleaned = clean_latex(text)
    if any(c in cleaned for c in "\\^{}") or "sqrt" in cleaned:
        return None
    return first_number(cleaned)
