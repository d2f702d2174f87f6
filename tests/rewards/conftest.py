"""The official IFEval evaluation (google-research's ``instruction_following_eval``, as shipped inside
``lm-eval``) loaded as a test oracle.

``lm_eval/tasks/__init__.py`` imports the whole harness and its heavy dependencies, so the official
modules are imported under a bare ``lm_eval.tasks`` package; nothing of theirs is copied into gym-llm.
Install with ``pip install --no-deps lm-eval``: the modules need only nltk, langdetect, immutabledict
and packaging, which ``if-verifiable`` already brings.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest


def load_official_ifeval():
    """``lm_eval.tasks.ifeval.utils``: ``InputExample``, ``test_instruction_following_strict``/``_loose``."""
    from gym_llm.rewards.ifeval import prepare

    prepare()  # punkt_tab on nltk's path first, or the official module tries to download it at import
    try:
        import lm_eval  # its __init__ is light
    except ImportError as e:
        raise RuntimeError("The IFEval oracle needs lm-eval: pip install --no-deps lm-eval.") from e
    saved = sys.modules.get("lm_eval.tasks")
    bare = types.ModuleType("lm_eval.tasks")
    bare.__path__ = [str(Path(lm_eval.__file__).parent / "tasks")]
    sys.modules["lm_eval.tasks"] = bare
    try:
        return importlib.import_module("lm_eval.tasks.ifeval.utils")
    finally:
        if saved is None:
            sys.modules.pop("lm_eval.tasks", None)
        else:
            sys.modules["lm_eval.tasks"] = saved


@pytest.fixture(scope="session")
def official_ifeval():
    return load_official_ifeval()
