"""Long subprocesses that tests start as soon as they are collected, so they run beside the rest of the suite.

The README's smoke path is a 250-step training run of about a minute and a half; run inline it would add that to the
suite's wall time, while most of the suite keeps one of the machine's cores busy. A test registers its command with
:func:`register` at import; when the test is selected, ``tests/conftest.py`` starts the command right after
collection, and the test collects the result with :func:`result` (starting it then if it was not started). Only the
wall time changes: the run is deterministic, and the test asserts on its output exactly as it would inline.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["register", "start_selected", "result", "stop_all", "Finished"]

Command = Callable[[Path], tuple[list[str], dict[str, str], Path]]  # out_dir -> (argv, env, cwd)


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    out_dir: Path


@dataclass
class _Job:
    process: subprocess.Popen | None  # None: another pytest-xdist worker started it
    out_dir: Path
    stdout: Path
    stderr: Path


_COMMANDS: dict[str, Command] = {}
_JOBS: dict[str, _Job] = {}


def register(test_name: str, command: Command) -> None:
    """``command(out_dir)`` gives the ``(argv, env, cwd)`` that test ``test_name`` (a function name) waits on."""
    _COMMANDS[test_name] = command


def _base() -> Path:
    """One folder per test run, shared by pytest-xdist workers (they see the same ``PYTEST_XDIST_TESTRUNUID``)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    base = Path(tempfile.gettempdir()) / f"gym-llm-background-{run}"
    base.mkdir(exist_ok=True)
    return base


def _start(test_name: str) -> _Job:
    out_dir = _base() / test_name
    stdout, stderr = out_dir / "stdout.txt", out_dir / "stderr.txt"
    try:
        out_dir.mkdir()  # whoever makes the folder runs the job; other xdist workers read its result
    except FileExistsError:
        _JOBS[test_name] = _Job(None, out_dir, stdout, stderr)
        return _JOBS[test_name]
    argv, env, cwd = _COMMANDS[test_name](out_dir)
    wrapper = ['sh', '-c', '"$@" >"$GYM_LLM_JOB/stdout.txt" 2>"$GYM_LLM_JOB/stderr.txt"; '
               'echo $? >"$GYM_LLM_JOB/rc.tmp"; mv "$GYM_LLM_JOB/rc.tmp" "$GYM_LLM_JOB/rc"', "sh", *argv]
    process = subprocess.Popen(wrapper, env={**env, "GYM_LLM_JOB": str(out_dir), _NESTED: test_name}, cwd=cwd,
                               start_new_session=True)
    (out_dir / "pgid").write_text(str(process.pid))
    _JOBS[test_name] = _Job(process, out_dir, stdout, stderr)
    return _JOBS[test_name]


_NESTED = "GYM_LLM_BACKGROUND_JOB"  # set in every job's environment: a job never starts jobs of its own


def start_selected(items: list) -> None:
    """Start the registered command of every selected test (called after collection and deselection); nothing
    inside a job (a job that runs pytest again must not start the jobs of the tests it runs)."""
    if os.environ.get(_NESTED):
        return
    for item in items:
        name = getattr(item, "originalname", None) or item.name
        if name in _COMMANDS and name not in _JOBS:
            _start(name)


def result(test_name: str, timeout_s: float) -> Finished:
    """Wait for ``test_name``'s command (started now if it was not) and return what it did."""
    job = _JOBS.get(test_name) or _start(test_name)
    rc_file = job.out_dir / "rc"
    deadline = time.monotonic() + timeout_s
    while not rc_file.exists():
        if time.monotonic() > deadline:
            if job.process is not None:
                os.killpg(job.process.pid, signal.SIGKILL)
                job.process.wait()
            raise subprocess.TimeoutExpired(str(test_name), timeout_s)
        time.sleep(0.2)
    if job.process is not None:
        job.process.wait()
    code = int(rc_file.read_text().strip())
    return Finished(code if code < 128 else -(code - 128), job.stdout.read_text(), job.stderr.read_text(), job.out_dir)


def stop_all(remove: bool = True) -> None:
    """At the end of the session: end every job still running and delete the run's output folders. A pytest-xdist
    worker passes ``remove=False`` and leaves both to the controller, which ends last (another worker may still be
    waiting on a job this one started)."""
    if not remove:
        return
    for job in _JOBS.values():
        if job.process is not None and job.process.poll() is None:
            job.process.kill()
    base = _base()
    for pgid in base.glob("*/pgid"):
        try:
            os.killpg(int(pgid.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError, PermissionError):
            pass
    for job in _JOBS.values():
        if job.process is not None:
            job.process.wait()
    _JOBS.clear()
    shutil.rmtree(base, ignore_errors=True)
