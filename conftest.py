"""Root pytest hooks (the suite's own are in tests/conftest.py): which files doctest collection opens, and which
tests a plain ``pytest`` leaves out (the heavy ones, ``@pytest.mark.slow``; see below).

``--doctest-modules`` imports every Python file under ``testpaths`` to look for doctests; most have none, and some
import heavy optional dependencies (the verifiers and OpenEnv integrations, an MCP server: seconds of imports in
each pytest-xdist worker). A module whose source has no ``>>>`` has no doctest, so unless it is a test file its
collection is skipped (the tests that use it import it where they run).
"""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

import pytest


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


# ------------------------------------------------------------------ the plain run and the heavy tests (-m slow)
# A plain `pytest` (no paths, no -m/-k) runs the suite without the tests marked @pytest.mark.slow: real engines and
# servers, trainers, learning checks, browsers. It stays under 10 minutes on the slowest 2-core CPU of this project's
# machines (an Intel Xeon without bf16 instructions took 16.5 minutes for everything, 5-7 without them). CI runs both
# (.ci/run: the plain run, then `pytest -m slow`). Naming files or folders runs every test in them; `-m`/`-k` select
# as usual; --include-slow runs everything in one session.
SLOW_LEFT_OUT = "gym_llm_slow_left_out"  # pytest-xdist: the controller's decision, handed to its workers


def pytest_addoption(parser):
    parser.addoption("--include-slow", action="store_true", default=False,
                     help="gym-llm: also run the heavy tests (@pytest.mark.slow) that a plain `pytest` leaves out; "
                          "`-m slow` runs only them. CI runs both.")


def leaves_out_slow(config) -> bool:
    """Whether this run leaves out the slow tests: only a plain run (the configured testpaths, no -m or -k)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and SLOW_LEFT_OUT in workerinput:
        return bool(workerinput[SLOW_LEFT_OUT])
    if config.getoption("include_slow") or config.option.markexpr or config.option.keyword:
        return False
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):  # pytest-xdist, on the controller: its workers decide as it did, whatever their args
    node.workerinput[SLOW_LEFT_OUT] = leaves_out_slow(node.config)


def pytest_report_header(config):
    if leaves_out_slow(config):
        return ["gym-llm: the heavy tests (@pytest.mark.slow) are left out of a plain run; "
                "`.venv/bin/python -m pytest -m slow` runs them (CI runs both, see the README's Tests)"]
    return []


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if leaves_out_slow(config) and not hasattr(config, "workerinput"):
        terminalreporter.write_line("gym-llm: heavy tests (@pytest.mark.slow) left out, as in every plain run; "
                                    "`.venv/bin/python -m pytest -m slow` runs them")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    if not leaves_out_slow(config):
        return
    kept, slow = [], []
    for item in items:
        (slow if item.get_closest_marker("slow") else kept).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = kept
