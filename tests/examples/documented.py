"""Run an example exactly as its docstring documents it: a subprocess in a temporary folder, with the checkout's
packages first on the path, the way a user runs it from the checkout."""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def documented_command(name: str, flag: str | None = "--tiny") -> list[str]:
    """The first ``python examples/<name> ...`` line of the example's docstring that has ``flag`` (None: the first
    line), as argv without the comment."""
    doc = ast.get_docstring(ast.parse((REPO / "examples" / name).read_text()))
    for line in doc.splitlines():
        if line.strip().startswith(f"python examples/{name}"):
            argv = shlex.split(line, comments=True)
            if flag is None or flag in argv:
                return argv
    raise AssertionError(f"examples/{name} documents no command with {flag}")


def run_example(argv: list[str], cwd: Path, *, timeout_s: float = 300, env: dict[str, str] | None = None) -> str:
    """Run ``argv`` (``python examples/...``) with this interpreter; returns stdout, fails with stderr's tail."""
    environ = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "adapters"), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, str(REPO / argv[1]), *argv[2:]], cwd=cwd, env=environ,
                            capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
