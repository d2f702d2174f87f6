"""Reading the final answer out of a reply: the shared, public extraction rules of the scored-reply envs.

* :func:`answer_tag` — the last ``<answer>...</answer>`` (TinyZero's and reasoning-gym's convention);
* :func:`answer_line` — the last ``Answer: ...`` line (short-answer QA; :mod:`gym_llm.rewards.short_answer`);
* :func:`final_answer` — the tag, else the line: what ``LLMCountdown-v0`` and ``LLMReasoningGym-v0`` read;
* :func:`read_final_answer` and :func:`tagged_answer_problem` — the same answer with what surrounds it, and the
  one-final-answer rule of :mod:`gym_llm.rewards.final_answer` on it: every other non-empty tag after the reasoning
  states the same answer, no hedge leads up to it, and what follows it may justify, restate or sign off but not
  correct, hedge or offer another answer;
* :func:`decorations_removed` — a tag's content without markdown, LaTeX math delimiters or a closing full stop.

Every rule is linear in the reply's length (a reply is untrusted input: no backtracking regex over it).

>>> final_answer("thinking...\\n<answer> (3 + 5) * 2 </answer>")
('(3 + 5) * 2', True)
>>> final_answer("So the result is\\nAnswer: 16")
('16', True)
>>> final_answer("I think it is 16.")
('', False)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

from gym_llm.rewards.final_answer import after_thinking, derived_in, later_problem, prefix_problem
from gym_llm.rewards.number_text import CALCULATOR_RE, clean_latex, unemphasize
from gym_llm.rewards.short_answer import extract_answer as _short_answer_line

__all__ = ["FinalAnswer", "answer_line", "answer_tag", "decorations_removed", "final_answer", "read_final_answer",
           "tagged_answer_problem"]

_OPEN, _CLOSE = "<answer>", "</answer>"
_ANSWER_LINE_RE = re.compile(r"^[ \t>*_#-]*(?:final[ \t]+)?answer[ \t*_]*:[ \t*_]*([^\n<]+)$",
                             re.IGNORECASE | re.MULTILINE)


def answer_tag(reply: str) -> str | None:
    """The text inside the last complete ``<answer>...</answer>`` (stripped; case-insensitive tags), or None.

    >>> answer_tag("<answer>1</answer> then <answer> 2 </answer>"), answer_tag("<answer>unclosed")
    ('2', None)
    """
    lowered = reply.lower()
    close = lowered.rfind(_CLOSE)
    if close < 0:
        return None
    start = lowered.rfind(_OPEN, 0, close)
    if start < 0:
        return None
    return reply[start + len(_OPEN):close].strip()


def answer_line(reply: str) -> str | None:
    """The text after the last ``Answer:`` line marker (the next non-empty line when the marker stands alone), or
    None when the reply has no such line.

    >>> answer_line("Work.\\n**Answer:** 42"), answer_line("42")
    ('42', None)
    """
    answer, formatted = _short_answer_line(reply)
    return answer if formatted else None


def final_answer(reply: str) -> tuple[str, bool]:
    """``(answer, found)``: :func:`answer_tag`, else :func:`answer_line`; ``("", False)`` when the reply states
    neither (the envs then grade it wrong rather than guess at a number in the prose)."""
    for rule in (answer_tag, answer_line):
        answer = rule(reply)
        if answer is not None:
            return answer, True
    return "", False


@dataclass(frozen=True, slots=True)
class FinalAnswer:
    """A reply's final answer and its surroundings (:func:`read_final_answer`).

    Attributes:
        text: the answer (:func:`final_answer`'s), "" when none was found.
        found: an ``<answer>`` tag or an ``Answer:`` line was found.
        others: the other non-empty ``<answer>`` contents after the reasoning (``</think>``), in order, then the
            ``Answer:`` lines after the first tag.
        prefix: the line that leads up to the first answer's tag.
        later: what follows the first answer after the reasoning (LaTeX, markdown and calculator notes removed).
        work: what leads up to the first answer (its last 2,000 characters, cleaned the same way).
    """

    text: str
    found: bool
    others: tuple[str, ...] = ()
    prefix: str = ""
    later: str = ""
    work: str = ""


def _tags(text: str) -> list[tuple[int, int, str]]:
    """Every complete ``<answer>...</answer>``: (start of the tag, end of the closing tag, content), in order."""
    lowered, out, position = text.lower(), [], 0
    while True:
        close = lowered.find(_CLOSE, position)
        if close < 0:
            return out
        start = lowered.rfind(_OPEN, position, close)
        if start >= 0:
            out.append((start, close + len(_CLOSE), text[start + len(_OPEN):close].strip()))
        position = close + len(_CLOSE)


def _plain(text: str) -> str:
    return unemphasize(clean_latex(CALCULATOR_RE.sub("", text)))


def read_final_answer(reply: str) -> FinalAnswer:
    """The final answer (:func:`final_answer`) with what :func:`tagged_answer_problem` judges around it. Tags in the
    reasoning before the last ``</think>`` are scratch work: only tags after it count, unless it has none.

    >>> read_final_answer("<think><answer>7</answer>?</think> <answer>8</answer> Hope this helps!")
    FinalAnswer(text='8', found=True, others=(), prefix=' ', later=' Hope this helps!', work=' ')
    """
    text, found = final_answer(reply)
    if not found:
        return FinalAnswer("", False)
    scope = after_thinking(reply)[0]
    tags = [t for t in _tags(scope) if t[2]]
    if not tags:
        scope, tags = reply, [t for t in _tags(reply) if t[2]]
    if not tags:  # an Answer: line (or only empty tags): the line is the whole answer
        return FinalAnswer(text, True)
    start, end, _ = tags[0]
    prefix = scope[scope.rfind("\n", 0, start) + 1:start]
    later = scope[end:].replace(_OPEN, " ").replace(_CLOSE, " ")
    lines = tuple(m.group(1).strip(" \t*_\r") for m in _ANSWER_LINE_RE.finditer(scope, end))  # "Answer: 2" after a tag
    others = tuple(c for _, _, c in tags[:-1]) + tuple(line for line in lines if line)
    work = _plain(scope[max(0, start - 2000):start])
    return FinalAnswer(tags[-1][2], True, others, _plain(prefix), _plain(later), work)


def tagged_answer_problem(answer: FinalAnswer, value: Fraction | None, same: Callable[[str], bool]) -> str | None:
    """Why ``answer`` breaks the one-final-answer rule, else ``None``: another tag that is not the ``same`` answer
    ("several final answers"), a hedge leading up to it, or what follows it (:func:`~gym_llm.rewards.final_answer.
    later_problem`, with the answer's ``value`` when it has one: "So the result is 35." after a target of 36)."""
    for other in answer.others:
        if not same(other):
            return f"several final answers ({other[:20]}, {answer.text[:20]})"
    return prefix_problem(answer.prefix) or later_problem(
        answer.later, value, derived_in=lambda: derived_in(answer.work, value),
        answer_text=decorations_removed(answer.text) if value is None else "")


_DECORATION_RE = re.compile(r"^(?:\\\(|\\\[|\$\$?|`+|\"|“|')\s*|(?<!\s)\s*(?:\\\)|\\\]|\$\$?|`+|\"|”|')$")


def decorations_removed(text: str) -> str:
    """``text`` without markdown emphasis, ``\\boxed{}``/``\\text{}``, surrounding ``$``, ``\\( \\)``, backticks or
    quotes, and a closing full stop.

    >>> decorations_removed("**olleh**."), decorations_removed("$\\\\boxed{-4}$"), decorations_removed("`3`")
    ('olleh', '-4', '3')
    """
    text = unemphasize(clean_latex(text.strip()))
    for _ in range(3):
        stripped = _DECORATION_RE.sub("", text).strip()
        for mark in ("**", "__"):  # bold around text that holds its own "*" ("**12 * 3**")
            if len(stripped) > 2 * len(mark) and stripped.startswith(mark) and stripped.endswith(mark):
                stripped = stripped[len(mark):-len(mark)].strip()
        if stripped.endswith(".") and not stripped.endswith(".."):
            stripped = stripped[:-1].rstrip()
        if stripped == text:
            break
        text = stripped
    return text
