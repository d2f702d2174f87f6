r"""One final answer: where an answer statement ends, what it may hold, and what may follow it.

A final answer (after ``####``, "The answer is", ``Answer:``, inside ``\boxed{}`` or ``<answer>``) is judged on its
**clause**: the text from the marker to the end of the sentence, a ``;``, a ``(``, a dash, a colon, or a comma or
word that starts a justification ("18, since 16 - 3 - 4 = 9 eggs are sold" -> "18"). What follows the clause may
justify, restate, add units, sign off or ask the reader something, with any numbers in it; it may not

* **correct** the answer: "Actually, 19", "Wait, I made an error: it is 20", "Oops, I meant 19", "No, it's 19";
* offer an **alternative**: "Or 19.", "or maybe 19", "Alternatively, it could be 19", "19 is also possible";
* **hedge**: "but I'm not sure", "I might be wrong", "probably 19", "give or take", "if my math is right";
* state **another answer**: a number alone ("\n19"), or a conclusion ("So she makes $20.", "Total: 20") whose
  numbers do not include the answer. (Other final-answer markers with another value — a second ``####`` line,
  "The answer is 20" — are the callers' check: :func:`gym_llm.rewards.gsm8k.grade`, :mod:`gym_llm.rewards.answers`.)

Text before the last ``</think>`` is scratch work and is not read. Every pattern is linear in the text (bounded
repeats only; ``tests/rewards/test_grading_time.py``).

>>> split_clause("18, since 16 - 3 - 4 = 9 eggs are sold at $2 each.")
('18', ', since 16 - 3 - 4 = 9 eggs are sold at $2 each.')
>>> split_clause("18 or 19, I think")[0], split_clause("18 dollars (9 eggs at $2)")[0]
('18 or 19', '18 dollars ')
>>> later_problem(". Let me know if you need help with the other 2 questions!", Fraction(18))
>>> later_problem("\nActually, 19.", Fraction(18))
'a correction after the final answer (Actually)'
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher
from fractions import Fraction
from typing import Callable

from gym_llm.rewards.number_text import CALCULATOR_RE, NUMBER_RE, clean_latex, to_fraction, unemphasize

__all__ = ["MAX_CLAUSE_CHARS", "MAX_LATER_CHARS", "after_thinking", "answer_problem", "answer_token", "answer_value", "derived_in", "is_sign_off",
           "later_problem", "number_hedged", "prefix_problem", "split_clause"]

MAX_CLAUSE_CHARS = 500
"""An answer's clause, at most ("Answer: she sells 16 - 3 - 4 = 9 eggs, so she makes 9 * $2 = $18" is 70)."""
MAX_LATER_CHARS = 8_000
"""What may follow a final answer, at most: closing remarks and justifications are short; a longer tail means the
answer was not the final one (and every later sentence is read, so this also bounds a grade's time)."""
_NUM = r"[-−]?\$?\s?\d"  # where a number starts (after an optional sign and currency)
_NUMBER = _NUM + r"(?:[\d,]|\.\d)*"  # and the rest of it

# ------------------------------------------------------------------------------------------------ the clause
_JUSTIFYING = (r"since|because|as|from|which|given|after|thanks\s+to|via|due\s+to|based\s+on|i\.e\.|e\.g\.|where"
               r"|when|by"
               r"|using|computed|calculated|counting")
_LEADING = (r"so|thus|therefore|hence|making|giving|meaning|for\s+a\s+total|that\s+means|this\s+means"
            r"|which\s+(?:gives|makes|means|comes\s+to|equals|totals|brings)")
_BREAK = r"[.!?](?=\s|$)|\n|[;(\[]|—|\s--?\s(?=[^\W\d_])|:\s"
# an answer that starts with its number ("18, so she is done") ends at any justifying or leading word; a prose answer
# ("she sells 9 eggs, so she makes $18") runs on through the words that lead to its result
_NUMBER_FIRST_BREAK_RE = re.compile(
    _BREAK + r"|,\s*(?=[^\W\d_])|\s(?=(?:" + _JUSTIFYING + r"|" + _LEADING + r")\b)", re.IGNORECASE)
_PROSE_BREAK_RE = re.compile(
    _BREAK + r"|,\s*(?=[^\W\d_])(?!(?:" + _LEADING + r")\b)|\s(?=(?:" + _JUSTIFYING + r")\b)", re.IGNORECASE)
"""Where a clause may end; a comma before a word (not before a number: "18, 19" stays one clause) is checked
against :data:`_KEEPS_CLAUSE_RE`."""
# after a comma, these keep the clause going: they join another candidate, or qualify the answer itself
_KEEPS_CLAUSE_RE = re.compile(
    r",\s*(?:or|nor|to|through|till|until|vs\.?|versus|plus|minus|times|either|not|no|never|maybe|perhaps"
    r"|possibly|probably|likely|about|approx|approximately|around|roughly|nearly|almost|over|under|at\s+(?:least|most)"
    r"|more|less|fewer|between|rounded|estimated|circa|ca\.|give|then\s+again|or\s+rather|on\s+second)\b"
    r"|,\s*and\s+" + _NUM,
    re.IGNORECASE,
)
_WORD_RE = re.compile(r"[^\W\d_]{2,}")


def split_clause(answer: str) -> tuple[str, str]:
    """``(clause, rest)`` of an answer's (cleaned) text: the clause runs past its first number to the first break
    (sentence end, newline, ``;``, ``(``, ``[``, a dash, ``": "``, a justifying word, or a comma before a word that
    does not join another candidate or qualify the answer). When words come before the number (a prose answer:
    "she sells 9 eggs, so she makes $18"), "so", "making", "which" and the like do not end it."""
    first = NUMBER_RE.search(answer)
    position = first.end() if first else 0
    prose = first is not None and len(_WORD_RE.findall(answer, 0, first.start())) > 1
    breaks = _PROSE_BREAK_RE if prose else _NUMBER_FIRST_BREAK_RE
    while True:
        brk = breaks.search(answer, position)
        if brk is None:
            return answer, ""
        if brk.group(0).startswith(",") and _KEEPS_CLAUSE_RE.match(answer, brk.start()):
            position = brk.end()
            continue
        return answer[:brk.start()], answer[brk.start():]


# ------------------------------------------------------------------------------------- what may not follow
_CORRECTION_RE = re.compile(
    r"(?:^|(?<=[\s,;:(—\"'*_-]))(?:"
    r"actually(?=\s*[,.!:]|\s+(?:\S+\s+){0,3}?" + _NUM + r"|\s*$)|(?:is|it'?s|be|'s|answer\s+is)\s+actually"
    r"|^\W*actually"
    r"|(?<!can't )(?<!can’t )(?<!cannot )wait(?!\s+(?:for|until|till|to)\b)(?!ing)"
    r"|hold\s+on|hang\s+on|oops|whoops|correction|corrected|(?:i|we)\s+meant|i\s+mean(?=\s*,|\s+" + _NUM + r")"
    r"|scratch\s+that|strike\s+that|let\s+me\s+(?:re-?(?:check|calculate|compute|do|consider|count|think|run|examine"
    r"|evaluate"
    r"|work|read|verify)|correct|fix|revise|try\s+again|start\s+over|think|check\s+again)"
    r"|re-?calculat\w*|re-?evaluat\w*|on\s+(?:second|further)\s+(?:thought|look|inspection|reflection)"
    r"|or\s+rather|then\s+again|hmm+|(?<!if )(?<!in case )i\s+(?:made|make|have\s+made|'ve\s+made)\s+(?:a|an|one)\s+"
    r"(?:\w+\s+)?(?:mistake|error|typo|slip)|my\s+(?:mistake|bad|error)|mis-?calculat\w*|mis-?count\w*|misread"
    r"|double[- ]counted|i\s+(?:forgot|missed|overlooked)|typo"
    r"|(?:that|this|which|it|the\s+above|(?:my|the)\s+(?:previous\s+|earlier\s+|first\s+|last\s+)?answer)"
    r"(?:\s+(?:is|was)|'s)\s+(?:wrong|incorrect|a\s+mistake|an\s+error|off|not\s+right|not\s+correct|mistaken)"
    r"|(?:i\s+was|i'?m)\s+wrong|can'?t\s+be\s+right|doesn'?t\s+(?:look|seem)\s+right|doesn'?t\s+add\s+up"
    r"|should\s+(?:actually\s+)?(?:be|have\s+been|read)\s+(?:\S+\s+){0,2}?" + _NUM +
    r"|the\s+(?:correct|right|real|actual|true|corrected)\s+(?:answer|value|total|result|number|amount)"
    r"|(?:update|edit|erratum)\s*:)(?!\w)",
    re.IGNORECASE,
)
_NO_RE = re.compile(r"^\W*no(?:pe)?\b(?!\s+(?:problem|worries|need|doubt)\b)", re.IGNORECASE)
_STRONG_HEDGE_RE = re.compile(
    r"\b(?:not\s+(?:[\w%]+,?\s+)?(?:sure|certain|confident|positive)|unsure|uncertain"
    r"|(?:might|may|could)\s+(?:be\s+(?:wrong|off|mistaken|incorrect)|have\s+(?:made|gotten|got|messed|mixed|slipped))"
    r"|if\s+i'?m\s+not\s+mistaken|if\s+i\s+did\s+(?:this|that|it|the\s+math)\s+(?:right|correctly)"
    r"|if\s+my\s+(?:math|calculations?|arithmetic|reasoning|logic)\s+(?:is|are)\s+(?:right|correct)"
    r"|give\s+or\s+take|or\s+so\b|roughly|approx(?:imately|\.)?|ballpark|more\s+or\s+less|plus\s+or\s+minus"
    r"|i'?m\s+guessing|(?:my\s+(?:best\s+)?|a\s+)guess|grain\s+of\s+salt|don'?t\s+quote\s+me|estimat\w*"
    r"|(?:is|are)\s+also\s+(?:possible|plausible|an?\s+option)|also\s+(?:possible|plausible)|(?:could|might|may)\s+also"
    r"\s+be|or\s+(?:maybe|perhaps|possibly|probably)"
    r"|alternatively,?\s+(?:it\s+)?(?:could|might|may|would)\s+(?:also\s+)?be"
    r"|(?:might|may|could|would)\s+also\s+work|also\s+works|works\s+too|would\s+work\s+too"
    r"|another\s+(?:option|possibility|possible\s+answer|valid\s+answer|candidate|answer)|either\s+(?:\S+\s+){0,6}?or"
    r")(?!\w)|(?<=\d)\s*-?ish\b",
    re.IGNORECASE,
)
_WEAK_HEDGE_RE = re.compile(r"\b(?:maybe|perhaps|probably|possibly|likely|presumably|i\s+think|i\s+believe|i\s+guess"
                            r"|i\s+suppose|i'?d\s+say|(?:could|might|may)\s+be|seems?)\b", re.IGNORECASE)
_HEDGED_NUMBER_RE = re.compile(  # "maybe 19", "probably it's 19", "I think it is 19": the hedge names a number
    r"\b(?:maybe|perhaps|probably|possibly|likely|i\s+think|i\s+believe|i\s+guess|(?:could|might|may)\s+be)"
    r"(?:\s+(?:it'?s|it\s+is|that'?s|that\s+is|is|be|it\s+should\s+be|closer\s+to|more\s+like|around|about))?\s+"
    + _NUMBER,
    re.IGNORECASE)
_ABOUT_THE_ANSWER_RE = re.compile(r"\b(?:answer|result|correct|right|wrong|accurate|solution|total|calculation|math)\b",
                                  re.IGNORECASE)
_TO_THE_READER_RE = re.compile(r"\b(?:you|your|yours|you'?[a-z]+)\b", re.IGNORECASE)
_ALTERNATIVE_RE = re.compile(  # "or 19" where a clause starts: ". Or 19.", "\nor 19", "(or 19)", ", or maybe 19"
    r"(?:^|[,;:(\[—–-])\s*(?:or|nor)\s+"
    r"(?:(?:maybe|perhaps|possibly|probably|even|else|rather|just|about|it'?s|it\s+is)"
    r"\s+){0,2}" + _NUMBER,
    re.IGNORECASE)
_NUMBER_OR_NUMBER_RE = re.compile(r"(?<![\d,.])(-?\d[\d,]*(?:\.\d+)?)\s*(?:,\s*)?(?:or|nor)\s+"
                                  r"(?:[^\W\d_]+\s+){0,2}?\$?(-?\d[\d,]*(?:\.\d+)?)",
                                  re.IGNORECASE)
_LIST_MARKER_RE = re.compile(r"(?m)^[ \t]*(?:\d{1,2}[.)]|[-*•+])[ \t]+")  # "1. ", "- ": a list item, not a number
_ALTERNATIVE_END_RE = re.compile(r"[,;)\]]|\s[—–]\s")
_OR_FIRST_RE = re.compile(r"\W*or\b", re.IGNORECASE)  # "Or 19.", "Or maybe twenty." (but "Or, if you like, ...")
_BARE_NUMBER_RE = re.compile(  # a sentence that is a number and little else: "19", "Or 19?", "= $20.", "So 19 dollars."
    r"[\s(\[*#>`\"']*(?:(?:or|and|so|maybe|perhaps|possibly|probably|alternatively|then|thus|hence|i\.e\.|=|~"
    r"|total:?|result:?),?\s*){0,2}([-−]?)\$?\s?(\d[\d,]*(?:\.\d+)?|\.\d+)\s*(?:%|[^\W\d_]+)?[\s)\].!?*`\"']*",
    re.IGNORECASE)
_CONCLUSION_RE = re.compile(
    r"^[\s*_#>\"'(]*(?:(?:that|this|which|it)\s+(?:comes?\s+(?:out\s+)?to|gives|makes|equals|totals|adds\s+up\s+to)"
    r"|so|thus|therefore|hence|in\s+total|in\s+all|all\s+in\s+all|altogether|overall|that\s+means|this\s+means"
    r"|which\s+means|in\s+conclusion|consequently|in\s+summary|to\s+summarize|total|the\s+total|the\s+result"
    r"|result|final(?:ly)?)\b", re.IGNORECASE)
_SENTENCES_RE = re.compile(r"(?<=[.!?])\s+|\n+|;\s*|(?<!\s)\s+[—–]\s+")  # (?<!\s): one try per run of spaces


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCES_RE.split(text) if s and s.strip()]


_WORDS_RE = re.compile(r"[^\W\d_]+")


def _repeats(sentence: str, derived_in: str) -> bool:
    """``sentence`` says what ``derived_in`` said, numbers aside: at least 3 words, 3/4 of all their words shared."""
    words = {w.lower() for w in _WORDS_RE.findall(sentence)}
    if len(words) < 3 or not _values(sentence):
        return False
    derived = {w.lower() for w in _WORDS_RE.findall(derived_in)}
    return len(words & derived) >= 0.75 * len(words | derived)


def _alternative(sentence: str, value: Fraction | None) -> re.Match | None:
    """"or 19" where a clause starts, a sentence that starts with "Or", or "18 or 19" naming the answer and another
    number; not in a question to the reader ("Is there a step (1, 2, or 3) you'd like me to expand on?"), and not
    "or" before an equation ("..., or 4 * 125 - 2 = 498 pounds": the work said another way)."""
    if sentence.rstrip(" )*_\"'").endswith("?") and _TO_THE_READER_RE.search(sentence):
        return None
    found = _ALTERNATIVE_RE.search(sentence)
    if found is None and not _TO_THE_READER_RE.search(sentence):
        found = _OR_FIRST_RE.match(sentence)
    if found is not None and "=" in _ALTERNATIVE_END_RE.split(sentence[found.start() + 1:], maxsplit=1)[0]:
        found = None
    if found is None and value is not None and not _TO_THE_READER_RE.search(sentence):
        for pair in _NUMBER_OR_NUMBER_RE.finditer(sentence):
            values = {to_fraction(pair.group(1)), to_fraction(pair.group(2))}
            if value in values and len(values) == 2:
                return pair
    return found


def _results(sentence: str) -> list[Fraction]:
    """What a sentence concludes: the first number after its last ``=``, else every number in it."""
    after = _values(sentence.rsplit("=", 1)[-1]) if "=" in sentence else []
    return after[:1] or _values(sentence)


def _values(text: str) -> list[Fraction]:
    return [v for v in (to_fraction(n) for n in NUMBER_RE.findall(text)) if v is not None]


def _hedge(sentence: str) -> re.Match | None:
    strong = _STRONG_HEDGE_RE.search(sentence)
    if strong:
        return strong
    named = _HEDGED_NUMBER_RE.search(sentence)
    if named:
        return named
    weak = _WEAK_HEDGE_RE.search(sentence)
    if weak is None or (sentence.rstrip(" )*_\"'").endswith("?") and len(sentence.split()) > 3):
        return None  # "maybe you'd like to try problem 3?" is no hedge; "Maybe?" is
    # "I think it continues from question 2" hedges nothing the reply answered; "I think that's right", "I believe
    # this is correct, but check with your teacher" and "Probably." do
    short = len(sentence.split()) <= 3 and not _TO_THE_READER_RE.search(sentence)
    about = _ABOUT_THE_ANSWER_RE.search(sentence) or short
    return weak if about else None


def later_problem(text: str, value: Fraction | None, *, derived_in: str | Callable[[], str] = "",
                  answer_text: str = "") -> str | None:
    """Why ``text`` — what follows a final answer's clause (cleaned: no LaTeX, emphasis or calculator notes) —
    breaks the one-final-answer rule, or ``None`` if it only justifies, restates, adds units, signs off or asks.
    ``value`` is the answer's value (``None``: not a number; then only the markers count). ``derived_in``: the
    sentence of the work that reached the answer (or a function that finds it, called only when needed); a later
    sentence that repeats it must repeat its number too
    ("#### 83" then "This gives a maximum of 15 boxes." after "... = 83 boxes."). ``answer_text``: an answer that is
    not a number; a later conclusion that states a result ("So the result is olleH.") must state it."""
    if len(text) > MAX_LATER_CHARS:
        return f"more than {MAX_LATER_CHARS:,} characters after the final answer (it is not the final answer)"
    for sentence in _sentences(_LIST_MARKER_RE.sub("", text.replace("’", "'"))):
        correction = _CORRECTION_RE.search(sentence) or _NO_RE.search(sentence)
        if correction:
            return f"a correction after the final answer ({correction.group(0).strip(' ,;:(—')})"
        alternative = _alternative(sentence, value)
        if alternative:
            return f"an alternative after the final answer ({alternative.group(0).strip(' ,;:([—–-')})"
        hedge = _hedge(sentence)
        if hedge:
            return f"a hedge after the final answer ({hedge.group(0).strip()})"
        if value is None:
            if answer_text and _states_another(sentence, answer_text):
                return f"another answer after the final answer ({sentence[:40]})"
            continue
        bare = _BARE_NUMBER_RE.fullmatch(sentence)
        if bare and to_fraction(bare.group(1) + bare.group(2)) != value:
            return f"another answer after the final answer ({bare.group(1) + bare.group(2)})"
        if callable(derived_in) and _values(sentence):
            derived_in = derived_in()
        if derived_in and _repeats(sentence, derived_in) and value not in _results(sentence):
            return f"another answer after the final answer (it repeats the work with {_results(sentence)[-1]})"
        if _CONCLUSION_RE.match(sentence) and not sentence.endswith("?") and not _TO_THE_READER_RE.search(sentence):
            numbers = _values(sentence)
            if numbers and value not in numbers:
                return f"another answer after the final answer ({sentence[:40]})"
    return None


_STATES_RE = re.compile(r"(?:\bis|\bare|=|:)\s+\S")


def _states_another(sentence: str, answer_text: str) -> bool:
    """A conclusion that states a result other than ``answer_text``, or a sentence that is the answer changed a
    little ("etnneritna" after "tenneritna"; the same words in another order)."""
    if _CONCLUSION_RE.match(sentence) and _STATES_RE.search(sentence) and not sentence.endswith("?"):
        return answer_text.casefold() not in sentence.casefold()
    said = sentence.strip(" .!*_`\"'").casefold()
    answer = answer_text.casefold()
    if answer in said or not said or len(said) > 400 or abs(len(said) - len(answer)) > max(2, len(answer) // 5):
        return False
    return SequenceMatcher(None, said, answer, autojunk=False).ratio() >= 0.8


def derived_in(work: str, value: Fraction | None) -> str:
    """The last sentence of ``work`` (cleaned text) that concludes ``value`` ("" if none): where the answer was reached,
    for :func:`later_problem`'s ``derived_in``."""
    if value is None:
        return ""
    for sentence in reversed(_sentences(work)):
        if value in _results(sentence):
            return sentence
    return ""


_SPEAKER_HEDGE_RE = re.compile(
    r"\b(?:i\s+think|i\s+believe|i\s+guess|i\s+suppose|i'?d\s+say|(?:i'?m\s+)?not\s+(?:\w+\s+)?sure|probably|maybe"
    r"|perhaps"
    r"|possibly|my\s+(?:best\s+)?guess|i'?m\s+guessing|seems?\s+to\s+be|answer\s+(?:could|might|may)\s+be)\b",
    re.IGNORECASE)


def number_hedged(sentence: str, number: str) -> str | None:
    """For an answer read from a sentence with no marker: a hedge of the speaker's before its (last) ``number``
    ("My best guess is 18", "I'd say 18"), an approximation right before it ("around 18"), or one in its clause
    after it ("18, maybe", "18 or so"). Words of the story are not hedges ("he estimates the height as 340 feet")."""
    at = sentence.rfind(number)
    if at < 0:
        return None
    before, after = sentence[:at], sentence[at:]
    found = (_SPEAKER_HEDGE_RE.search(before) or _APPROXIMATE_RE.search(before[-30:])
             or _CLAUSE_HEDGE_RE.search(split_clause(after)[0]))
    return None if found is None else f"a hedged final answer ({found.group(0).strip()})"


def prefix_problem(text: str) -> str | None:
    """A hedge in the text that leads up to a final answer's marker within its sentence or line ("I think the
    answer is 18", "Probably: #### 18"); a correction there is fine (it corrects *to* this answer)."""
    sentence = _sentences(text.replace("’", "'"))[-1] if text.strip() else ""
    hedge = _hedge(sentence) if sentence else None
    return None if hedge is None else f"a hedged final answer ({hedge.group(0).strip()})"


_SIGN_OFF_RE = re.compile(
    r"^\W*(?:thanks|thank\s+you|cheers)|\b(?:let\s+me\s+know|feel\s+free|hope\s+(?:this|that|it)\s+helps|happy\s+to"
    r"|glad\s+to|good\s+luck|any\s+(?:other\s+|more\s+|further\s+)?questions"
    r"|(?:need|want)\s+(?:any\s+)?(?:more\s+)?help"
    r"|if\s+you\s+(?:have|need|want|would|'d|'re)|would\s+you\s+like|do\s+you\s+want|want\s+me\s+to|shall\s+i"
    r"|should\s+i)\b", re.IGNORECASE)


_ASKS_RE = re.compile(r"^\W*(?:does|do|did|would|want|shall|should|can|could|is|are|any|how|what|which|may|will)\b",
                      re.IGNORECASE)


def is_sign_off(sentence: str) -> bool:
    """A closing remark to the reader (a question to them, "let me know", "hope this helps", "good luck"...): the
    last-sentence fallback looks for the answer before it."""
    asks = sentence.rstrip(" )*_\"'").endswith("?") and (_ASKS_RE.match(sentence) or _TO_THE_READER_RE.search(sentence))
    return bool(asks) or _SIGN_OFF_RE.search(sentence) is not None


def after_thinking(text: str) -> tuple[str, int]:
    """``(text after the last "</think>", its offset)``: reasoning before it is scratch work, not the answer."""
    end = text.rfind("</think>")
    return (text, 0) if end < 0 else (text[end + len("</think>"):], end + len("</think>"))


# ------------------------------------------------------------------------------- what the clause may hold
_SIGNED_CURRENCY_RE = re.compile(r"[-−]\s*\$\s*(?=\d)|\$\s*[-−]\s*(?=\d)")  # -$18, $-18: the sign stays
_APPROXIMATE_RE = re.compile(r"(?:\b(?:around|about|approximately|approx\.?|roughly|nearly|almost|over|under|at\s+least"
                             r"|at\s+most|more\s+than|less\s+than|fewer\s+than)|[~≈<>])\s*\$?\s*$", re.IGNORECASE)
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
_UNIT_POWER_RE = re.compile(r"(?<=[^\W\d_])\^\{?[23]\}?(?!\d)")  # m^2, cm^{3}: a unit, not an operator
_CLAUSE_HEDGE_RE = re.compile(
    r"\b(?:approx\.?|or (?:more|less|so|fewer|above|below)|rounded|estimated?|maybe|perhaps|probably|possibly"
    r"|likely|give or take|plus or minus|circa|ca\.|then again|or rather|on second thought)(?!\w)|(?<=\d)\s*-?ish\b",
    re.IGNORECASE)
_OR_BETWEEN_RE = re.compile(r"\d[^\W\d_]*\s*(?:,\s*)?(?:or|nor|and/or)\s+(?:[^\W\d_]+\s+){0,2}?" + _NUM, re.IGNORECASE)
_MALFORMED_NUMBER_RE = re.compile(r"(?<![\d.])\d+(?:\.\d+){2,}|(?<![\d_])\d+(?:_+\d+)+")  # 18.0.0, 18_19
# what the answer's value is taken after: the last "=", or a connective that leads to a consequence ("9 eggs at $2,
# so she makes $18": the value is after "so")
_RESULT_LEAD_RE = re.compile(r"=|(?:,\s*|\b)(?:so|thus|therefore|hence|making|giving|which\s+gives|for\s+a\s+total\s+of"
                             r"|which\s+means|that\s+means|meaning)\b", re.IGNORECASE)
_SENTENCE_END_RE = re.compile(r"\.(?:\s|$)|\n")


def _result_tail(clause: str) -> str:
    last = None
    for last in _RESULT_LEAD_RE.finditer(clause):
        pass
    return clause if last is None else clause[last.end():]


_STRAY_EMPHASIS_RE = re.compile(r"(?<!\d)(?:\*\*|__)|(?:\*\*|__)(?!\d)")  # "18** — because": not 18**2


def _cleaned(answer: str) -> str:
    return _STRAY_EMPHASIS_RE.sub("", unemphasize(clean_latex(CALCULATOR_RE.sub("", answer)))).replace("’", "'")


def answer_token(answer: str) -> str | None:
    """The number an answer states, as written (its clause's number after the last ``=`` or "so"; thousands
    separators dropped, a sign before a currency sign kept), ``None`` if none.

    >>> answer_token("**$1,234** per month, since ..."), answer_token("x = -$4")
    ('1234', '-4')
    """
    clause, _ = split_clause(_cleaned(answer))
    if len(clause) > MAX_CLAUSE_CHARS:
        return None
    numbers = NUMBER_RE.findall(_SIGNED_CURRENCY_RE.sub("-", _result_tail(clause)))
    return numbers[0].replace(",", "").replace("−", "-").strip() if numbers else None


def answer_value(answer: str) -> Fraction | None:
    """:func:`answer_token` as an exact rational."""
    token = answer_token(answer)
    return None if token is None else to_fraction(token)


def answer_problem(answer: str, *, later_sentences: bool = True) -> str | None:
    """Why a final answer's text breaks the one-answer rule, or ``None`` if it keeps it.

    The answer's clause (:func:`split_clause`), after its last ``=`` (or "so", "making", "for a total of"), states
    **exactly one number**, with no negation or comparison (``not 18``, ``!= 18``, ``about 18``, ``> 18``), no
    operator (``18**2``, ``9^{9^{9}}``, ``\\sqrt{324}``, ``20 - 2``, ``19 \\lor 18``), no unit multiplier (``18e3``,
    ``18k``, ``18 thousand``) and no hedge (``18ish``, ``18 or more``, ``probably 18``); a sign before a currency sign
    counts (``-$18`` is -18). Thousands separators, currency, ``%``, units (``18 m^2``) and words around the number,
    ``\\frac{a}{b}``, ``a/b`` and mixed numbers, ``\\boxed{}`` and ``\\text{}`` are fine. Also wrong: something that is
    not one number (``18.0.0``, ``18_19``) and no number at all (``eighteen``: write it in digits). With
    ``later_sentences``, what follows the clause in ``answer`` must keep :func:`later_problem`'s rule.

    >>> answer_problem("$70,000"), answer_problem("18 or 19"), answer_problem("not 18")
    (None, 'several candidate numbers (18, 19)', 'a negation or comparison (not)')
    >>> answer_problem("18, since 16 - 3 - 4 = 9 eggs are sold at $2 each."), answer_problem("18. Or 19.")
    (None, 'an alternative after the final answer (Or 19)')
    """
    cleaned = _cleaned(answer)
    clause, rest = split_clause(cleaned)
    if len(clause) > MAX_CLAUSE_CHARS:
        return f"not one number (an answer clause of {len(clause):,} characters; at most {MAX_CLAUSE_CHARS})"
    malformed = _MALFORMED_NUMBER_RE.search(clause)
    if malformed:
        return f"not one number ({malformed.group(0)})"
    signed = _SIGNED_CURRENCY_RE.sub("-", clause)
    first_sentence = clause + _SENTENCE_END_RE.split(rest, maxsplit=1)[0]
    negation = _NEGATION_RE.search(signed) or _CLAUSE_HEDGE_RE.search(first_sentence)
    if negation:
        return f"a negation or comparison ({negation.group(0).strip()})"
    tail = _UNIT_POWER_RE.sub("", _result_tail(signed))
    multiplier = _MULTIPLIER_RE.search(tail)
    if multiplier:
        return f"a unit multiplier ({multiplier.group(0)[1:].strip()})"
    operator = _OPERATOR_RE.search(tail)
    if operator:
        return f"an operator ({operator.group(0).strip()})"
    numbers = NUMBER_RE.findall(tail)
    values = list(dict.fromkeys(to_fraction(n) for n in numbers))
    if len(values) > 1 or _OR_BETWEEN_RE.search(signed):
        shown = numbers if len(values) > 1 else NUMBER_RE.findall(signed)
        return f"several candidate numbers ({', '.join(n.strip() for n in shown[:4])})"
    if not numbers:
        return "no number (write the answer in digits)"
    return later_problem(rest, values[0]) if later_sentences else None
