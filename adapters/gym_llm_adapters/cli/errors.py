"""How the ``gym-llm`` command fails: a user error is one or two lines and exit status 2, an internal error a
traceback and where to report it.

* :class:`UsageError` — what the user gave was wrong (an unknown env id, a missing file, a bad value, an extra not
  installed): ``gym-llm CMD: error: <what was wrong, what was expected, the fix>`` on stderr, exit status 2, no
  traceback (``--debug`` shows it). Raised by the checks every subcommand runs **before** it loads a model or starts
  an engine.
* Anything else is a bug: the traceback, then where to report it, exit status 1.
"""

from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["UsageError", "closest", "REPORT_URL"]

REPORT_URL = "https://github.com/gym-llm/gym-llm/issues"


class UsageError(Exception):
    """Bad input to the command; the message says what was wrong and how to fix it."""


def closest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for the nearest choice, or ``""``."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""
