"""Long subprocesses that tests start as soon as they are collected, so they run beside the rest of the suite.

The README's main job is a 250-step training run of about a minute and a half; run inline it would add that to the
suite's wall time, while most of the suite keeps one of the machine's cores busy. A test registers its command with
:func:`register` at import; when the test is selected, ``tests/conftest.py`` starts the command right after
collection, and the test collects the result with :func:`result` (starting it then if it was not started). Only the
wall time changes: the run is deterministic, and the test asserts on its output exactly as it would inline.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
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
    process: subprocess.Popen
    out_dir: Path
    stdout: Path
    stderr: Path


_COMMANDS: dict[str, Command] = {}
_JOBS: dict[str, _Job] = {}


def register(test_name: str, command: Command) -> None:
    """``command(out_dir)`` gives the ``(argv, env, cwd)`` that test ``test_name`` (a function name) waits on."""
    _COMMANDS[test_name] = command


def _start(test_name: str) -> _Job:
    out_dir = Path(tempfile.mkdtemp(prefix=f"gym-llm-{test_name}-"))
    argv, env, cwd = _COMMANDS[test_name](out_dir)
    stdout, stderr = out_dir / "stdout.txt", out_dir / "stderr.txt"
    with open(stdout, "w") as out, open(stderr, "w") as err:
        process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err)
    _JOBS[test_name] = _Job(process, out_dir, stdout, stderr)
    return _JOBS[test_name]


def start_selected(items: list) -> None:
    """Start the registered command of every selected test (called after collection)."""
    for item in items:
        name = getattr(item, "originalname", None) or item.name
        if name in _COMMANDS and name not in _JOBS:
            _start(name)


def result(test_name: str, timeout_s: float) -> Finished:
    """Wait for ``test_name``'s command (started now if it was not) and return what it did."""
    job = _JOBS.get(test_name) or _start(test_name)
    try:
        job.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        job.process.kill()
        job.process.wait()
        raise
    return Finished(job.process.returncode, job.stdout.read_text(), job.stderr.read_text(), job.out_dir)


def stop_all() -> None:
    """End what is still running and remove the output folders (at the end of the session)."""
    for job in _JOBS.values():
        if job.process.poll() is None:
            job.process.kill()
            job.process.wait()
        shutil.rmtree(job.out_dir, ignore_errors=True)
    _JOBS.clear()
