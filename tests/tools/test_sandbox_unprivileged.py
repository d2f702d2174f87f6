"""The sandbox's security suite again, as an unprivileged user (uid/gid 65534, no groups, no capabilities).

The rest of the suite runs as whoever runs it — root on these machines and in CI, where bubblewrap runs in user
namespaces this package makes (:mod:`gym_llm.tools.sandbox.userns`) and cgroups are available. Here the same
attacks (``test_sandbox_security.py``, ``test_sandbox_attacks*.py``) and the forked REPLs' isolation
(``test_python_fork.py``) and the copy-on-write fork's (``test_cow_fork.py``) run with no privilege at all: bubblewrap makes
its own user namespace, every REPL is the host user, and no cgroup can be made — the limits the tool reports as in
force there are the ones the attacks must meet. The pass starts when the suite is collected and runs beside it
(``tests/background.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests import background
from tests.tools import unprivileged

REPO = Path(__file__).resolve().parents[2]
MODULES = ["tests/tools/test_sandbox_security.py", "tests/tools/test_sandbox_attacks.py",
           "tests/tools/test_sandbox_attacks_episodes.py", "tests/tools/test_sandbox_attacks_resources.py",
           "tests/tools/test_repl_socket.py",
           "tests/tools/test_python_fork.py", "tests/tools/test_cow_fork.py",
           "tests/tools/test_fork_budget.py", "tests/envs/test_code_attacks.py"]
pytestmark = pytest.mark.slow


def _command(out_dir: Path) -> tuple[list[str], dict[str, str], Path]:
    home = out_dir / "home"  # inside the job's folder, which the session removes: nothing is left in /tmp
    home.mkdir()
    out_dir.chmod(0o777)  # the unprivileged pass writes its pytest temp dirs here
    home.chmod(0o777)
    pytest_argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(out_dir / "t"),
                   "-o", "addopts=--strict-markers", *MODULES]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")]), "OMP_NUM_THREADS": "1"}
    if os.geteuid() != 0:  # already unprivileged: the pass is the same user in a fresh process
        return pytest_argv, env, REPO
    return unprivileged.command(pytest_argv, needed=[str(REPO), sys.prefix], stash=str(out_dir / "stash")), env, REPO


background.register("test_security_suite_holds_as_an_unprivileged_user", _command)


def test_security_suite_holds_as_an_unprivileged_user():
    done = background.result("test_security_suite_holds_as_an_unprivileged_user", timeout_s=600)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, summary
    if os.geteuid() == 0:  # it really ran unprivileged: bubblewrap made the user namespace, no cgroups
        assert int(summary.split(" passed")[0].split()[-1]) >= 50, summary
