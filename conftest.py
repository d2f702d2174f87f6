"""Root pytest hooks (the suite's own are in tests/conftest.py).

``--doctest-modules`` imports every Python file under ``testpaths`` to look for doctests; most have none, and some
import heavy optional dependencies (the verifiers and OpenEnv integrations, an MCP server: seconds of imports in
each pytest-xdist worker). A module whose source has no ``>>>`` has no doctest, so unless it is a test file its
collection is skipped (the tests that use it import it where they run).
"""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path


def pytest_ignore_collect(collection_path: Path, config):
    if collection_path.suffix != ".py" or collection_path.name == "conftest.py":
        return None
    if any(fnmatch(collection_path.name, pattern) for pattern in config.getini("python_files")):
        return None  # a test file: collected for its tests
    try:
        if ">>>" not in collection_path.read_text(encoding="utf-8"):
            return True
    except OSError:
        return None
    return None
