"""The rules of bench/judge_cases.py: small pure functions (``check_<rule>``) that decide each case's label, and the
one-sentence criterion a judge rubric quotes for each rule.

``langdetect`` is seeded here (``DetectorFactory.seed = 0``), so every label is deterministic.
"""

from __future__ import annotations

import json
import re
from typing import Callable

from langdetect import DetectorFactory, detect
from langdetect.lang_detect_exception import LangDetectException

DetectorFactory.seed = 0


def count_words(reply: str) -> int:
    """Words as a reader counts them: whitespace-separated tokens holding at least one letter or digit ("don't",
    "9:00", "first-aid" are one word each; a lone "-" or "—" is none)."""
    return sum(1 for token in reply.split() if any(ch.isalnum() for ch in token))


def _has_word(reply: str, word: str) -> bool:
    """``word`` (or phrase) occurs as a whole word, case-insensitively: not inside a longer word ("rain" is not
    in "rainfall"); hyphens and punctuation are boundaries ("plastic" is in "plastic-free")."""
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", reply, flags=re.IGNORECASE) is not None


def check_max_words(reply: str, max_words: int) -> bool:
    """At most ``max_words`` words (:func:`count_words`)."""
    return count_words(reply) <= max_words


def check_min_words(reply: str, min_words: int) -> bool:
    """At least ``min_words`` words (:func:`count_words`)."""
    return count_words(reply) >= min_words


def check_keywords(reply: str, keywords: tuple[str, ...]) -> bool:
    """Every keyword appears as a whole word (or phrase), case-insensitively; a longer word containing it
    ("rainfall" for "rain", "projects" for "project") does not count."""
    return all(_has_word(reply, word) for word in keywords)


def check_forbidden(reply: str, word: str) -> bool:
    """``word`` does not appear as a whole word, case-insensitively ("plan" may appear inside "planet")."""
    return not _has_word(reply, word)


def check_language(reply: str, language: str) -> bool:
    """``langdetect`` (seeded) names ``language`` (an ISO 639-1 code: "en", "fr", "es", "de") as the reply's
    language; an undetectable reply (empty, no letters) fails."""
    try:
        return detect(reply) == language
    except LangDetectException:
        return False


def check_json_keys(reply: str, keys: tuple[str, ...]) -> bool:
    """The whole reply (surrounding whitespace aside) parses as one JSON object (``json.loads``: no code fence,
    no prose, no trailing commas, double quotes only) that has every key in ``keys``, exactly spelled; extra keys
    are allowed."""
    try:
        value = json.loads(reply)
    except ValueError:
        return False
    return isinstance(value, dict) and all(key in value for key in keys)


def check_bullets(reply: str, count: int) -> bool:
    """Exactly ``count`` lines start with "- " (hyphen, space, at the very start of the line). Other lines (an
    intro, a closing sentence) are allowed; "* ", "•", "1." and "-word" are not bullets of this form."""
    return sum(1 for line in reply.splitlines() if line.startswith("- ")) == count


def check_lowercase(reply: str) -> bool:
    """No capital letters at all (``reply == reply.lower()``) and at least one letter."""
    return reply == reply.lower() and any(ch.isalpha() for ch in reply)


def check_question_end(reply: str) -> bool:
    """The last non-whitespace character is "?" (a closing quote, bracket, emoji or sign-off after it fails)."""
    return reply.rstrip().endswith("?")


RULES: dict[str, Callable[..., bool]] = {
    "max_words": check_max_words,
    "min_words": check_min_words,
    "keywords": check_keywords,
    "forbidden": check_forbidden,
    "language": check_language,
    "json_keys": check_json_keys,
    "bullets": check_bullets,
    "lowercase": check_lowercase,
    "question_end": check_question_end,
}

_LANGUAGE_NAMES = {"en": "English", "fr": "French", "es": "Spanish", "de": "German"}


def _quoted_list(items: tuple[str, ...]) -> str:
    quoted = [f'"{item}"' for item in items]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def criterion_for(rule: str, **params) -> str:
    """The one-sentence criterion a judge rubric quotes for ``rule`` with ``params``."""
    if rule == "max_words":
        return f"The reply must be at most {params['max_words']} words long."
    if rule == "min_words":
        return f"The reply must be at least {params['min_words']} words long."
    if rule == "keywords":
        keywords = params["keywords"]
        noun = "word" if len(keywords) == 1 else "words"
        return (f"The reply must contain the {noun} {_quoted_list(keywords)} (case does not matter; each must appear "
                f"as a whole word, not as part of a longer word).")
    if rule == "forbidden":
        return (f"The reply must not contain the word \"{params['word']}\" (in any capitalisation; a longer word "
                f"that merely contains it is allowed).")
    if rule == "language":
        return f"The reply must be written in {_LANGUAGE_NAMES[params['language']]}."
    if rule == "json_keys":
        return (f"The reply must be a single valid JSON object, with no other text and no code fence, that has the "
                f"keys {_quoted_list(params['keys'])}.")
    if rule == "bullets":
        return (f"The reply must contain exactly {params['count']} bullet points, each on its own line starting "
                f"with \"- \" (a hyphen and a space).")
    if rule == "lowercase":
        return "The reply must be written entirely in lowercase letters, with no capital letters at all."
    if rule == "question_end":
        return "The reply must end with a question mark."
    raise KeyError(rule)
