"""The sandbox-heavy tests under load: what passes alone must pass while both cores are taken.

Two CPU hogs (one per core of these machines) and a churn of other sandboxes (sessions started, run a CPU-bound cell
and ended, over and over) compete with a run of the sandbox-heavy test files. Any failure here that the same files do
not show alone (they run in every plain run) is a wait or a clock that assumed an idle machine: readiness waits
scale with the load, and per-call timeouts are what the user set (the tests give their calls room).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gym_llm.tools import PythonTool, ToolCall

REPO = Path(__file__).resolve().parents[2]
FILES = ["tests/tools/test_python_tool.py", "tests/tools/test_repl_socket.py", "tests/tools/test_fork_budget.py",
         "tests/tools/test_sandbox_layouts.py", "tests/envs/test_python_tool_env.py", "tests/envs/test_mlgym.py"]
HOG = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"

pytestmark = pytest.mark.slow


def _churn(stop: threading.Event, counts: dict) -> None:
    """Other sandboxes, started and ended back to back, each running a CPU-bound cell."""
    tool = PythonTool(min_idle=1, timeout_s=60.0)
    tool.attach()
    try:
        while not stop.is_set():
            session = tool.open_session()
            try:
                result = session.run(ToolCall("python", {"code": "sum(i * i for i in range(300_000))"}))
                counts[result.status] = counts.get(result.status, 0) + 1
                if result.status != "ok":
                    counts.setdefault("why", []).append(result.content[-300:])
            finally:
                session.close()
    finally:
        tool.detach()


def test_sandbox_tests_pass_while_the_cores_are_taken():
    hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(seconds=900)]) for _ in range(os.cpu_count() or 2)]
    stop, counts = threading.Event(), {}
    churn = threading.Thread(target=_churn, args=(stop, counts), daemon=True)
    churn.start()
    start = time.monotonic()
    try:
        time.sleep(5)  # the load is there before the tests start
        done = subprocess.run([sys.executable, "-m", "pytest", *FILES, "-q", "-p", "no:cacheprovider", "-m", "not slow",
                               "-n", "2"], cwd=REPO, capture_output=True, text=True, timeout=1200)
    finally:
        stop.set()
        for hog in hogs:
            hog.kill()
            hog.wait()
        churn.join(timeout=120)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary, summary
    assert counts.get("ok", 0) >= 5 and set(counts) == {"ok"}, counts  # the competing sandboxes ran, and correctly
    print(f"under load: {summary} ({time.monotonic() - start:.0f} s; {counts.get('ok', 0)} competing episodes)")
