"""User namespaces that map the sandbox to unprivileged host uids when the host runs as root.

Bubblewrap started by root keeps host uid 0 in its uid map: every process in the sandbox *is* host root to the
kernel's "is this uid 0?" checks (host-global sysctls under ``/proc/sys`` become writable, for one). So on a root
host the sandbox runs in two user namespaces made here, once per process:

* ``U1``, a child of the host's namespace, maps uid 0 to host 0 (bubblewrap needs it to reach the host paths it
  binds, e.g. an interpreter under a ``0700`` ``/root``), plus the sandbox's own uids to themselves;
* ``U2``, a child of ``U1``, maps its uid 0 to the unprivileged host uid :data:`ZYGOTE_UID` and the REPL uids
  (``REPL_UID_BASE + k``) to themselves.

``U1`` is made by a process that has already become :data:`ZYGOTE_UID`, so the namespace is owned by that uid: the
kernel charges per-user counts of everything below it (inotify instances, queued signals, namespaces) up the chain
of owners, which then ends at ``ZYGOTE_UID``, not at host root — a sandbox cannot exhaust root's own counts.

Bubblewrap builds the sandbox in ``U1`` (``--userns``) and runs the zygote in ``U2`` (``--userns2``): the zygote
and relays are host uid ``ZYGOTE_UID`` with capabilities only inside ``U2`` (to build each REPL's namespaces), and
each REPL drops to its own host uid with no capabilities at all. None of them is host root.

The namespaces are made by a short-lived helper process (``python -c``; forking this multi-threaded process is
not safe), which holds them until this process has opened them: the open fds keep them alive.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gym_llm.core.forksafe import ForkSafeLock

__all__ = ["ZYGOTE_UID", "REPL_UID_BASE", "REPL_UIDS", "root_namespaces", "repl_uid_pair", "release_uid_pair"]

ZYGOTE_UID = 1_900_000_000
"""Host uid of the zygote and the relays on a root host (uid 0 inside ``U2``). Far above the uids distributions
hand out and above the usual subordinate-uid ranges."""
REPL_UID_BASE = ZYGOTE_UID + 1
REPL_UIDS = 65_536
"""REPL host uids are ``REPL_UID_BASE .. REPL_UID_BASE + REPL_UIDS - 1``; each live sandbox holds two (its REPL and
its pre-forked spare), so ``RLIMIT_NPROC`` counts one REPL's threads alone."""

_HELPER = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER = 0x10000000
maps = json.loads(sys.argv[1])

def check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")

def write_maps(pid, lines):
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(lines)

release_r, release_w = os.pipe()  # children hold their namespace until this process exits (end of file)
ready_r, ready_w = os.pipe()
owner = maps["owner"]

def make_u1(as_owner):
    pid = os.fork()
    if pid == 0:
        os.close(release_w)  # or release_r never sees end of file, and this process outlives the helper
        try:
            if as_owner:  # U1 owned by the unprivileged sandbox uid: the kernel charges the sandbox's per-user
                os.setgroups([])  # counts (inotify, pending signals, namespaces) to it, never to host root
                os.setresgid(owner, owner, owner)
                os.setresuid(owner, owner, owner)
            check(libc.unshare(CLONE_NEWUSER), "unshare (U1)")
        except OSError:
            os.write(ready_w, b"0")
            os._exit(1)
        os.write(ready_w, b"1")
        os.read(release_r, 1)
        os._exit(0)
    return pid, os.read(ready_r, 1) == b"1"

u1, made = make_u1(True)
owned = made
if not made:  # unprivileged user namespaces are switched off here (sysctl, AppArmor): root makes U1 instead
    os.waitpid(u1, 0)
    u1, made = make_u1(False)
    if not made:
        sys.exit("unshare (U1) failed as the sandbox uid and as root")
write_maps(u1, maps["u1"])  # we are in U1's parent namespace, with CAP_SETUID there
pid_r, pid_w = os.pipe()
writer = os.fork()
if writer == 0:  # a process in U1 writes U2's maps (only U2's parent namespace may)
    os.close(release_w)
    check(libc.setns(os.open(f"/proc/{u1}/ns/user", os.O_RDONLY), CLONE_NEWUSER), "setns (U1)")
    u2 = os.fork()
    if u2 == 0:
        check(libc.unshare(CLONE_NEWUSER), "unshare (U2)")
        os.write(ready_w, b"2")
        os.read(release_r, 1)
        os._exit(0)
    if os.read(ready_r, 1) != b"2":
        os._exit(1)
    write_maps(u2, maps["u2"])
    os.write(pid_w, str(u2).encode().ljust(16))
    os.read(release_r, 1)
    os._exit(0)
u2 = int(os.read(pid_r, 16))
sys.stdout.write(json.dumps({"u1": u1, "u2": u2, "owned": owned}) + "\n")
sys.stdout.flush()
sys.stdin.read(1)
"""

NAMESPACE_OWNER: int | None = None
"""Host uid that owns ``U1`` once made: :data:`ZYGOTE_UID`, or 0 where unprivileged user namespaces are switched
off (then the sandbox's per-user kernel counts are charged to host root; the REPL's own limits still bound them)."""

_LOCK = ForkSafeLock()
_NAMESPACES: tuple[int, int] | None = None
_FREE_PAIRS: list[int] = []
_NEXT_PAIR = 0


def root_namespaces() -> tuple[int, int]:
    """``(U1, U2)`` as open fds, made on first use (root hosts only). Raises ``OSError`` with the reason."""
    global _NAMESPACES
    with _LOCK:
        if _NAMESPACES is not None:
            return _NAMESPACES
        z, base, n = ZYGOTE_UID, REPL_UID_BASE, REPL_UIDS
        maps = {"u1": f"0 0 1\n{z} {z} 1\n{base} {base} {n}\n", "u2": f"0 {z} 1\n{base} {base} {n}\n", "owner": z}
        helper = subprocess.Popen([sys.executable, "-I", "-S", "-c", _HELPER, json.dumps(maps)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            line = helper.stdout.readline()
            if not line:
                raise OSError(f"could not make the sandbox's user namespaces: "
                              f"{helper.stderr.read().decode(errors='replace').strip()[-500:]}")
            pids = json.loads(line)
            fds = tuple(os.open(f"/proc/{pids[key]}/ns/user", os.O_RDONLY | os.O_CLOEXEC) for key in ("u1", "u2"))
            global NAMESPACE_OWNER
            NAMESPACE_OWNER = ZYGOTE_UID if pids.get("owned") else 0
        finally:
            try:
                helper.stdin.write(b"x")
                helper.stdin.close()
            except OSError:
                pass
            helper.wait(timeout=10)
            helper.stdout.close()
            helper.stderr.close()
        _NAMESPACES = fds  # kept open for the process's life: every sandbox joins the same two
        return fds


def repl_uid_pair() -> tuple[int, int]:
    """Two REPL uids no other live sandbox of this process uses (give them back with :func:`release_uid_pair`)."""
    global _NEXT_PAIR
    with _LOCK:
        if _FREE_PAIRS:
            pair = _FREE_PAIRS.pop()
        else:
            if 2 * (_NEXT_PAIR + 1) > REPL_UIDS:
                raise RuntimeError(f"more than {REPL_UIDS // 2} sandboxes at once")
            pair, _NEXT_PAIR = _NEXT_PAIR, _NEXT_PAIR + 1
    return REPL_UID_BASE + 2 * pair, REPL_UID_BASE + 2 * pair + 1


def release_uid_pair(uids: tuple[int, int]) -> None:
    with _LOCK:
        _FREE_PAIRS.append((uids[0] - REPL_UID_BASE) // 2)


def _reset_after_fork() -> None:
    """A forked child (e.g. an AsyncVectorEnv worker) makes namespaces of its own: the kernel counts a REPL's
    threads per (user namespace, uid), and the parent hands out the same uid pairs."""
    global _NAMESPACES, _FREE_PAIRS, _NEXT_PAIR
    _NAMESPACES, _FREE_PAIRS, _NEXT_PAIR = None, [], 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
