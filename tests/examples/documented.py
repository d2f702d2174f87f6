"""Run an example exactly as its docstring documents it, from a temporary folder, the way a user runs it from the
checkout.

:func:`run_example` runs ``python examples/NAME.py ARGS`` *in the test's process*: ``runpy`` with ``__name__ ==
"__main__"``, ``sys.argv`` and the script's folder first on ``sys.path``, as ``python`` sets them. A fresh
interpreter would spend most of a tiny run importing torch, transformers, vLLM or TRL (``from trl import
GRPOTrainer`` alone is ~10 CPU-seconds): the examples' tests took ~95 CPU-seconds that way, 33 in-process (AMD EPYC,
2026-11-28). What the example changes in the process — environment variables, ``sys.argv``, ``sys.path``, the working
directory, the ``_common`` helper module — is put back afterwards, also when it fails.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import runpy
import shlex
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


_DISTRIBUTED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_example(argv: list[str], cwd: Path, *, env: dict[str, str] | None = None) -> str:
    """Run ``argv`` (``python examples/NAME.py ...``) in this process from ``cwd``, with ``env`` added to the
    environment; returns what it printed on stdout (stderr passes through to pytest's capture)."""
    script = REPO / argv[1]
    saved = dict(os.environ), list(sys.argv), list(sys.path), os.getcwd()
    os.environ.update(env or {})
    for name in _DISTRIBUTED:  # a user's shell, not a distributed worker's
        os.environ.pop(name, None)
    sys.argv = [str(script), *argv[2:]]
    sys.path.insert(0, str(script.parent))
    sys.modules.pop("_common", None)  # another folder's _common (bench/'s) imported earlier in this process
    os.chdir(cwd)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:  # argparse's exit, or the example's own sys.exit(...)
        if e.code not in (None, 0):
            raise AssertionError(f"{' '.join(argv)} exited with {e.code!r}; it printed:\n{out.getvalue()[-3000:]}")
    finally:
        os.environ.clear()
        os.environ.update(saved[0])
        sys.argv[:], sys.path[:] = saved[1], saved[2]
        os.chdir(saved[3])
        sys.modules.pop("_common", None)  # examples/_common.py: imported afresh by the next example
    return out.getvalue()
