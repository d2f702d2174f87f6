"""A plain ``pytest`` leaves out the heavy tests (``@pytest.mark.slow``) and says so; every other way of choosing
tests keeps them (the root ``conftest.py``). Run on a throwaway project that uses the checkout's root conftest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("plain-run")
    shutil.copy(REPO / "conftest.py", root / "conftest.py")
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["t"]\naddopts = "-p no:cacheprovider"\n'
        'markers = ["slow: heavy"]\n')
    (root / "t").mkdir()
    (root / "t" / "test_a.py").write_text(
        "import pytest\n\n"
        "def test_light():\n    pass\n\n"
        "@pytest.mark.slow\ndef test_heavy():\n    pass\n\n"
        "class TestGroup:\n    pytestmark = pytest.mark.slow\n\n    def test_heavy_in_a_class(self):\n        pass\n")
    return root


def pytest_in(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this run's (xdist's) settings
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=120)


def run(project: Path, *args: str) -> tuple[set[str], str]:
    """The tests that ran (``-v`` names) and the whole output."""
    out = pytest_in(project, "-v", "-n", "0", *args)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ran = {line.split("::")[-1].split()[0] for line in out.stdout.splitlines() if " PASSED" in line}
    return ran, out.stdout


def test_a_plain_run_leaves_out_the_heavy_tests_and_says_how_to_run_them(project):
    ran, out = run(project)
    assert ran == {"test_light"}
    assert "2 deselected" in out and "pytest -m slow` runs them" in out  # the header and the summary say so


@pytest.mark.parametrize("args, expected", [
    (("-m", "slow"), {"test_heavy", "test_heavy_in_a_class"}),
    (("-m", "not slow"), {"test_light"}),
    (("--include-slow",), {"test_light", "test_heavy", "test_heavy_in_a_class"}),
    (("t/test_a.py",), {"test_light", "test_heavy", "test_heavy_in_a_class"}),  # named files run whole
    (("t/test_a.py::test_heavy",), {"test_heavy"}),
    (("-k", "heavy"), {"test_heavy", "test_heavy_in_a_class"}),
])
def test_any_other_choice_of_tests_keeps_them(project, args, expected):
    ran, out = run(project, *args)
    assert ran == expected
    assert "left out of a plain run" not in out


def test_xdist_workers_follow_the_controller(project):
    """Under pytest-xdist the workers are given node ids, not the testpaths: the controller's decision reaches them."""
    out = pytest_in(project, "-q", "-n", "2")
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    out = pytest_in(project, "-q", "-n", "2", "--include-slow")
    assert out.returncode == 0 and "3 passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
