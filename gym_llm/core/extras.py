"""Optional dependencies: check them when an env is made, and say which extra installs what is missing.

``require("ifeval", "if_verifiable", "langdetect", "nltk", "punkt", needed_by="LLMIFEval-v0")``
looks the modules up without importing them (cheap) and raises :class:`MissingExtraError` — a
``ModuleNotFoundError`` — naming the env, the missing modules and the command that installs them.
"""

from __future__ import annotations

import importlib.util

__all__ = ["MissingExtraError", "require"]


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message says ``pip install 'gym-llm[EXTRA]'``."""


def require(extra: str, *modules: str, needed_by: str) -> None:
    """Raise :class:`MissingExtraError` unless every one of ``modules`` can be imported."""
    missing = [m for m in modules if _missing(m)]
    if missing:
        raise MissingExtraError(
            f"{needed_by} needs the {extra!r} extra, which is not installed (missing: {', '.join(missing)}). "
            f"Install it with: pip install 'gym-llm[{extra}]'",
            name=missing[0],
        )


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent package is missing, or a broken entry in sys.modules
        return True
