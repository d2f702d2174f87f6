"""Run a command as an unprivileged user (uid/gid 65534, no groups, no capabilities) from a root test process.

``setpriv --reuid 65534 --regid 65534 --clear-groups`` is the whole switch, except on machines where the interpreter
lives under a directory that uid 65534 cannot traverse (pyenv under a ``0700`` ``/root``). There the command runs
in a private mount namespace (``unshare --mount``: nothing changes on the host) where each such directory is
covered by a ``0755`` tmpfs holding bind mounts of just the entries the command needs.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

UID = GID = 65534


def _blocked(path: Path) -> tuple[Path, str] | None:
    """The first ancestor of ``path`` uid 65534 cannot traverse, and the entry below it on the way to ``path``."""
    parts = path.resolve().parts
    for depth in range(1, len(parts) - 1):
        directory = Path(*parts[: depth + 1])
        mode = directory.stat().st_mode
        if not (mode & stat.S_IXOTH):
            return directory, parts[depth + 1]
    return None


def command(argv: list[str], needed: list[str], stash: str) -> list[str]:
    """``argv`` run as uid/gid 65534; ``needed``: paths the command must reach (interpreter, checkout, venv);
    ``stash``: a new directory the bind mounts are staged in (the caller removes it afterwards)."""
    covers: dict[Path, set[str]] = {}
    for path in [os.path.realpath(sys.executable), *needed]:
        blocked = _blocked(Path(path))
        if blocked is not None:
            covers.setdefault(blocked[0], set()).add(blocked[1])
    drop = ["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--"]
    if not covers:
        return drop + argv
    script = ["set -e", f"stash={shlex.quote(stash)}", 'mkdir -p "$stash"']
    for index, (directory, entries) in enumerate(sorted(covers.items())):
        for entry in sorted(entries):
            source = shlex.quote(str(directory / entry))
            script += [f"mkdir -p $stash/{index}/{shlex.quote(entry)}", f"mount --bind {source} $stash/{index}/{shlex.quote(entry)}"]
        script.append(f"mount -t tmpfs -o mode=0755,size=1m tmpfs {shlex.quote(str(directory))}")
        for entry in sorted(entries):
            target = shlex.quote(str(directory / entry))
            script += [f"mkdir -p {target}", f"mount --bind $stash/{index}/{shlex.quote(entry)} {target}"]
    script.append('exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script), "sh", *drop, *argv]
