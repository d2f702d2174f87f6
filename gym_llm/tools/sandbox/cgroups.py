"""Per-sandbox cgroups: memory (shmem, tmpfs and kernel memory included) and task counts, where the host allows.

``RLIMIT_AS`` bounds a process's address space, not what it makes the kernel hold: pages of tmpfs files, memfd and
shared memory written without being mapped, page tables, socket buffers. A memory cgroup counts all of those, and a
pids cgroup counts threads as root, where ``RLIMIT_NPROC`` does not. So each sandbox (bubblewrap, zygote, relays,
REPLs) runs in a cgroup of its own when the host lets this process make one:

* **cgroup v1** (separate ``memory`` and ``pids`` hierarchies, e.g. ``/sys/fs/cgroup/memory``): a directory under
  this process's own cgroup in each hierarchy, when writable (usually: running as root). ``memory.limit_in_bytes``
  (and ``memory.memsw.limit_in_bytes`` when swap is accounted) and ``pids.max``.
* **cgroup v2** (one unified hierarchy): a directory under this process's cgroup, when ``memory`` and ``pids`` are
  available there and its ``cgroup.subtree_control`` lets them be enabled (a root host, or a systemd unit with
  ``Delegate=yes``). ``memory.max``, ``memory.swap.max = 0`` and ``pids.max``.
* neither: no cgroup; :class:`CgroupSupport` says why, and the sandbox keeps its rlimits (``RLIMIT_AS``,
  ``RLIMIT_NPROC`` where each REPL has a uid of its own) and tmpfs caps.

Detected once per process (:func:`detect`), never assumed. The sandbox's processes join their cgroup before
bubblewrap starts (a one-line shell wrapper writes its pid to ``cgroup.procs`` and ``exec``\\ s bubblewrap), so
nothing escapes it; the directory is removed when the sandbox is killed, and directories left by a process that
died are removed by the next one.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from gym_llm.core.forksafe import ForkSafeLock

__all__ = ["CgroupSupport", "SandboxCgroup", "detect"]

logger = logging.getLogger(__name__)

_PREFIX = "gym-llm-"


@dataclass(frozen=True)
class CgroupSupport:
    """What this process can do with cgroups.

    Attributes:
        version: ``1``, ``2`` or ``None`` (no usable memory+pids cgroups).
        parents: where sandbox cgroups are made: ``{"memory": dir, "pids": dir}`` (v1) or ``{"unified": dir}`` (v2).
        reason: why there is none (or what is used), for logs and ``PythonTool.limits``.
    """

    version: int | None
    parents: dict[str, Path] = field(default_factory=dict)
    reason: str = ""


def _own_cgroups(proc_self_cgroup: str) -> dict[str, str]:
    """``{controller or "": path}`` from ``/proc/self/cgroup`` (``""`` is the v2 hierarchy)."""
    out = {}
    for line in proc_self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(",") if parts[1] else [""]:
                out[name] = parts[2]
    return out


def _mounts(proc_mounts: str) -> dict[str, Path]:
    """``{"memory": mountpoint, "pids": ..., "unified": ...}`` from ``/proc/self/mounts``."""
    out: dict[str, Path] = {}
    for line in proc_mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mountpoint, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup2":
            out.setdefault("unified", Path(mountpoint))
        elif fstype == "cgroup":
            for controller in ("memory", "pids"):
                if controller in options:
                    out[controller] = Path(mountpoint)
    return out


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def detect(proc_self_cgroup: str | None = None, proc_mounts: str | None = None) -> CgroupSupport:
    """Find the hierarchies this process may make sandbox cgroups in (arguments: file contents, for tests)."""
    try:
        own = _own_cgroups(proc_self_cgroup if proc_self_cgroup is not None else Path("/proc/self/cgroup").read_text())
        mounts = _mounts(proc_mounts if proc_mounts is not None else Path("/proc/self/mounts").read_text())
    except OSError as e:
        return CgroupSupport(None, reason=f"cannot read this process's cgroups ({e})")
    v1 = {c: mounts[c] / own[c].lstrip("/") for c in ("memory", "pids") if c in mounts and c in own}
    if len(v1) == 2:
        if all(_writable_dir(p) for p in v1.values()):
            return CgroupSupport(1, v1, "cgroup v1: memory and pids")
        v1_reason = f"cgroup v1 memory/pids under {sorted(str(p) for p in v1.values())} are not writable"
    else:
        v1_reason = "no cgroup v1 memory and pids hierarchies"
    if "unified" in mounts and "" in own:
        parent = mounts["unified"] / own[""].lstrip("/")
        controllers = set((parent / "cgroup.controllers").read_text().split()) if (
            parent / "cgroup.controllers").is_file() else set()
        missing = {"memory", "pids"} - controllers
        if missing:
            return CgroupSupport(None, reason=f"{v1_reason}; cgroup v2 at {parent} lacks {sorted(missing)} "
                                              "(not delegated to this process)")
        if not _writable_dir(parent):
            return CgroupSupport(None, reason=f"{v1_reason}; cgroup v2 at {parent} is not writable")
        return CgroupSupport(2, {"unified": parent}, "cgroup v2: memory and pids")
    return CgroupSupport(None, reason=f"{v1_reason}; no cgroup v2")


class SandboxCgroup:
    """The cgroup(s) of one sandbox: created empty, joined by the sandbox's first process, removed at the end.

    Args:
        support: from :func:`detect` (``version`` must not be None).
        name: unique among this process's sandboxes.
        max_tasks: ``pids.max``.
    """

    _pool_dirs: dict[str, Path] = {}
    _lock = ForkSafeLock()

    def __init__(self, support: CgroupSupport, name: str, *, max_tasks: int):
        if support.version is None:
            raise ValueError("no usable cgroups: " + support.reason)
        self.version = support.version
        self.dirs: dict[str, Path] = {}
        with self._lock:  # an owner dir is removed when its last sandbox goes: make ours under the same lock
            for key, parent in support.parents.items():
                owner = self._owner_dir(key, parent)
                path = owner / name
                path.mkdir()
                self.dirs[key] = path
        if self.version == 2:
            self._write("unified", "pids.max", str(max_tasks))
        else:
            self._write("pids", "pids.max", str(max_tasks))

    @classmethod
    def _owner_dir(cls, key: str, parent: Path) -> Path:
        """This process's directory of sandbox cgroups under ``parent`` (made when needed; stale ones of dead processes
        go). Called with ``_lock`` held."""
        cached = cls._pool_dirs.get(key)
        if cached is not None and cached.parent == parent and cached.name == f"{_PREFIX}{os.getpid()}" \
                and cached.is_dir():
            return cached
        _remove_stale(parent)
        path = parent / f"{_PREFIX}{os.getpid()}"
        path.mkdir(exist_ok=True)
        if key == "unified":  # let the children have memory and pids controllers
            (path / "cgroup.subtree_control").write_text("+memory +pids")
        cls._pool_dirs[key] = path
        return path

    def _write(self, key: str, name: str, value: str) -> None:
        (self.dirs[key] / name).write_text(value)

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the sandbox's first process writes its pid into."""
        return [str(path / "cgroup.procs") for path in self.dirs.values()]

    def memory_usage(self) -> int:
        if self.version == 2:
            return int((self.dirs["unified"] / "memory.current").read_text())
        return int((self.dirs["memory"] / "memory.usage_in_bytes").read_text())

    def limit_memory(self, limit_bytes: int) -> None:
        """Cap the sandbox's memory (and swap: none) at ``limit_bytes``."""
        if self.version == 2:
            self._write("unified", "memory.max", str(limit_bytes))
            swap = self.dirs["unified"] / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
            return
        memory = self.dirs["memory"]
        self._write("memory", "memory.limit_in_bytes", str(limit_bytes))
        if (memory / "memory.memsw.limit_in_bytes").exists():
            (memory / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))

    def oom_kills(self) -> int:
        """How many processes the kernel killed in this cgroup for exceeding its memory limit."""
        try:
            if self.version == 2:
                text = (self.dirs["unified"] / "memory.events").read_text()
            else:
                text = (self.dirs["memory"] / "memory.oom_control").read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self, timeout_s: float = 2.0) -> None:
        """Remove the directories (once the killed processes have left them), and this process's owner directory
        when no other sandbox of it is left, so a clean shutdown leaves no cgroup behind."""
        for path in self.dirs.values():
            _rmdir(path, timeout_s)
        with self._lock:
            for key, path in self.dirs.items():
                owner = path.parent
                try:
                    if not any(child.is_dir() for child in owner.iterdir()):
                        owner.rmdir()
                        if self._pool_dirs.get(key) == owner:
                            del self._pool_dirs[key]
                except OSError:  # another sandbox of ours is still there, or it is already gone
                    pass


def _rmdir(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                logger.warning("could not remove the sandbox cgroup %s: %s", path, e)
                return
            time.sleep(0.01)


def _remove_stale(parent: Path) -> None:
    """Remove the sandbox cgroups of processes that are gone (they died without cleaning up)."""
    try:
        entries = list(parent.glob(f"{_PREFIX}*"))
    except OSError:
        return
    for owner in entries:
        pid = owner.name[len(_PREFIX):]
        if not pid.isdigit() or int(pid) == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        for child in owner.iterdir() if owner.is_dir() else ():
            if child.is_dir():
                _rmdir(child, 0.5)
        _rmdir(owner, 0.5)
