"""Root pytest hooks (the suite's own are in tests/conftest.py).

``--doctest-modules`` over ``gym_llm`` imports every module to look for doctests; most have none, and some import
heavy optional dependencies (the verifiers and OpenEnv integrations: ~6 s of imports in each pytest-xdist worker).
A module whose source has no ``>>>`` has no doctest, so its doctest collection is skipped (the tests that use it
import it where they run).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent / "gym_llm"


def pytest_ignore_collect(collection_path: Path, config):
    if collection_path.suffix == ".py" and collection_path.is_relative_to(_PACKAGE):
        try:
            if ">>>" not in collection_path.read_text(encoding="utf-8"):
                return True
        except OSError:
            return None
    return None
