"""Short-answer exact match: the final ``Answer: ...`` line against a list of accepted answers.

Normalisation follows SQuAD's exact-match metric (Rajpurkar et al., 2016, the official evaluation
script): lowercase, drop punctuation and the articles a/an/the; unlike SQuAD, a decimal point between
digits is kept (``1.8`` is not ``18``) and whitespace is dropped (``"1.8 kg"`` equals ``"1.8kg"``). A
reply is correct when its normalised answer equals the normalised form of any accepted answer.

>>> grade("I found it on the clock's page.\\nAnswer: **86.50 dollars**", ["$86.50", "86.50 dollars"]).correct
True
>>> grade("It is probably 1875.", ["1874"])
ShortAnswerGrade(correct=False, formatted=False, extracted='It is probably 1875.', reference='1874')
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Sequence

__all__ = ["ShortAnswerGrade", "extract_answer", "grade", "normalize_answer"]

# Within one line only ([ \t], never \s): with \s the line-start run could cross newlines, and a reply of 20,000 blank
# lines took 5 s to grade (quadratic). Each repeat below is bounded by its line, and the capture is greedy-free of
# backtracking into the trailing run (it is stripped in extract_answer instead).
_ANSWER_LINE = re.compile(r"^[ \t>*_#-]*answer[ \t*_]*:[ \t*_]*([^\n]*)$", re.IGNORECASE | re.MULTILINE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation + "‘’“”–—")
_DECIMAL_POINT = re.compile(r"(?<=\d)\.(?=\d)")
_POINT = "\x00"  # stands in for a decimal point while punctuation is removed


@dataclass(frozen=True, slots=True)
class ShortAnswerGrade:
    """Attributes: ``correct``; ``formatted`` (an ``Answer:`` line was found); ``extracted`` (the answer
    compared: the last ``Answer:`` line, else the last non-empty line); ``reference`` (the first accepted answer)."""

    correct: bool
    formatted: bool
    extracted: str
    reference: str


def normalize_answer(text: str) -> str:
    """Lowercase, no punctuation (but decimal points), no articles, no whitespace.

    >>> [normalize_answer(t) for t in ("The Tin Whistle.", "4,087", "#HS-40317", "$86.50", "1.8 kg")]
    ['tinwhistle', '4087', 'hs40317', '86.50', '1.8kg']
    """
    text = _DECIMAL_POINT.sub(_POINT, text.lower()).translate(_PUNCTUATION)
    return "".join(_ARTICLES.sub(" ", text).split()).replace(_POINT, ".")


def extract_answer(reply: str) -> tuple[str, bool]:
    """``(answer, formatted)``: the text after the last ``Answer:`` line marker (markdown bold allowed; the next
    non-empty line when the marker stands alone), else the last non-empty line of the reply."""
    last = None
    for last in _ANSWER_LINE.finditer(reply):
        pass
    if last is not None:
        answer = last.group(1).rstrip(" \t*_\r").strip()
        if not answer:  # "Answer:" alone on its line: the answer is the next non-empty line
            following = (line.strip(" \t*_\r") for line in reply[last.end():].splitlines())
            answer = next((line.strip() for line in following if line.strip()), "")
        return answer, True
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    return (lines[-1] if lines else ""), False


def grade(reply: str, accepted: Sequence[str]) -> ShortAnswerGrade:
    """Exact match (after :func:`normalize_answer`) of the reply's answer with any accepted answer.

    Raises:
        ValueError: ``accepted`` is empty or holds a non-string.
    """
    if isinstance(accepted, str):
        accepted = [accepted]
    if not accepted or not all(isinstance(a, str) and normalize_answer(a) for a in accepted):
        raise ValueError(f"accepted answers must be a non-empty list of non-empty strings, got {accepted!r}.")
    extracted, formatted = extract_answer(reply)
    answer = normalize_answer(extracted)
    correct = bool(answer) and any(answer == normalize_answer(a) for a in accepted)
    return ShortAnswerGrade(correct, formatted, extracted, accepted[0])
