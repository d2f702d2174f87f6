"""Reading the final answer out of a reply: the shared, public extraction rules of the scored-reply envs.

* :func:`answer_tag` — the last ``<answer>...</answer>`` (TinyZero's and reasoning-gym's convention);
* :func:`answer_line` — the last ``Answer: ...`` line (short-answer QA; :mod:`gym_llm.rewards.short_answer`);
* :func:`final_answer` — the tag, else the line: what ``LLMCountdown-v0`` and ``LLMReasoningGym-v0`` read.

Every rule is linear in the reply's length (a reply is untrusted input: no backtracking regex over it).

>>> final_answer("thinking...\\n<answer> (3 + 5) * 2 </answer>")
('(3 + 5) * 2', True)
>>> final_answer("So the result is\\nAnswer: 16")
('16', True)
>>> final_answer("I think it is 16.")
('', False)
"""

from __future__ import annotations

from gym_llm.rewards.short_answer import extract_answer as _short_answer_line

__all__ = ["answer_line", "answer_tag", "final_answer"]

_OPEN, _CLOSE = "<answer>", "</answer>"


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
