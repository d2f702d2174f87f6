"""Copy-on-write fork of a live, untrusted process, made from outside by a ptrace tracer (x86-64 Linux).

The building block for forking a REPL that has run model code (issue 23; ``docs/branching.md``). Nothing the
process does on request can be trusted once its code is untrusted — it may have patched its own fork handler — so
here the *tracer* builds the copy: it stops the process, makes it call ``clone()`` with flags the tracer chose (new
user, pid, mount, IPC, network and UTS namespaces), and sets the stopped copy up with syscalls the tracer injects —
its id maps, its own session, a fresh channel socket in place of the old one, every other inherited descriptor
closed, no capabilities — before the copy runs a single instruction of its own. Memory is shared copy-on-write: a
fork of a process holding hundreds of MB takes milliseconds and the copies cost only the pages they write.

Gate: a process confined by a seccomp filter that answers ``SECCOMP_RET_TRACE`` for the calls the set-up needs
(``clone`` with namespace flags, ``setresuid``, ``capset``, ...) cannot make them itself — with no tracer attached
the kernel fails them with ``ENOSYS`` — while the same calls injected by the tracer pass: the tracer is attached
only while it injects, and only to the one thread it stopped (``PTRACE_O_TRACESECCOMP`` lets them through).

Refused (:func:`hazards`, before anything is stopped): a process with more than one thread (only the stopped thread
is copied: a lock another thread holds — Python's GIL — would never be released in the copy) or with shared memory
mappings (``MAP_SHARED`` memory stays shared across ``clone``: a channel between parent and copy).

What the fork does *not* do (the caller's part, e.g. the sandbox's): give the copy its own scratch files (its mount
namespace starts as a copy of the parent's, so the same tmpfs is mounted at the same place: over-mount a fresh one
through ``setup``), and reap it.

The injection itself (stopping, injected calls, letting go, the watchdog) is :mod:`gym_llm.tools.sandbox.ptrace`.
:func:`cow_fork` runs start to end in its caller's thread (the kernel ties a tracee to the tracing thread); nothing
else in the process may ``waitpid`` on the forked process meanwhile.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal
import socket
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from gym_llm.tools.sandbox.ptrace import (
    O_EXITKILL,
    O_TRACEFORK,
    O_TRACESECCOMP,
    O_TRACESYSGOOD,
    WALL,
    Stuck,
    TraceError,
    Tracee,
    Watchdog,
    libc,
    wait_stop,
)

__all__ = ["CowForkError", "Forked", "cow_fork", "hazards", "unsupported_reason", "NAMESPACES"]

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_PARENT = 0x10000000, 0x20000000, 0x40000000, 0x8000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS
"""The namespaces every copy gets: user (its ids and capabilities are its own), pid (it is pid 1 of its own and sees
no other process), mount, IPC, network (nothing but a down loopback) and UTS."""

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_AT_FDCWD = -100
_O_RDWR, _O_CLOEXEC = 2, 0o2000000
_PROT_READ_WRITE, _MAP_PRIVATE_ANONYMOUS = 3, 0x22
_SYSTEM_DIRS = ("/usr/", "/lib/", "/lib64/", "/etc/")
_PR_SET_SECUREBITS, _PR_SET_NO_NEW_PRIVS = 28, 38
_SECURE_ALL = 0xEF  # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE, each with its lock
_KEYCTL_JOIN_SESSION_KEYRING = 1
_PR_CAPBSET_DROP = 24
_WNOHANG = 1
_ERESTARTNOINTR = 513


class CowForkError(TraceError):
    """The copy could not be made; the parent is left running as it was and no copy is left behind."""


def unsupported_reason() -> str | None:
    """Why :func:`cow_fork` cannot run here (None: it can)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"copy-on-write forks inject x86-64 syscalls; this is {platform.system()} on {platform.machine()}"
    release = tuple(int(p) for p in platform.release().split(".")[:2] if p.isdigit())
    if release < (5, 6):
        return f"copy-on-write forks need Linux >= 5.6 (pidfd_getfd); this kernel is {platform.release()}"
    return None


def _last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40  # CAP_CHECKPOINT_RESTORE, the last one since Linux 5.9


def _ids(pid: int) -> tuple[int, int]:
    """The effective uid and gid of ``pid`` as this process's user namespace sees them."""
    uid = gid = None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                uid = int(line.split()[2])
            elif line.startswith("Gid:"):
                gid = int(line.split()[2])
    if uid is None or gid is None:
        raise CowForkError(f"cannot read the ids of pid {pid}")
    return uid, gid


def hazards(pid: int, *, writable_paths: tuple[str, ...] = (), seccomp_filters: int | None = None) -> list[str]:
    """Why a copy of ``pid`` would not be its own (empty: none): other threads; shared memory mappings; mappings of
    files under ``writable_paths`` (e.g. the scratch dir: the parent writes such a file and the copy sees it through
    pages neither has written, even in a private mapping); more seccomp filters than ``seccomp_filters`` (one the
    process stacked itself could answer the set-up's calls for it)."""
    found = []
    if seccomp_filters is not None:
        stacked = int(_status(pid).get("Seccomp_filters", "0"))
        if stacked != seccomp_filters:
            found.append(f"it runs under {stacked} seccomp filters, not {seccomp_filters}")
    threads = _live_threads(pid)
    if threads > 1:
        found.append(f"it runs {threads} threads (only one would be copied, and a lock another holds, e.g. Python's "
                     "GIL, would never be released in the copy)")
    shared = []
    with open(f"/proc/{pid}/maps") as f:  # (smaps would say "may write" exactly, but reading it takes ms)
        for line in f:
            parts = line.split(maxsplit=5)
            path = parts[5].strip() if len(parts) == 6 else "[anonymous]"
            # shared and writable: a channel; shared read-only system files (the C library's gconv cache) are not,
            # where nobody can write them (a sandbox binds them read-only)
            under_writable = any(path == d or path.startswith(d.rstrip("/") + "/") for d in writable_paths)
            if parts[1][3] == "s" and ("w" in parts[1] or not path.startswith(_SYSTEM_DIRS)) or under_writable:
                shared.append(f"{parts[0]} {parts[1]} {path}")
    if shared:
        found.append(f"{len(shared)} shared or writable-file memory mapping(s) the copy would share with it: "
                     f"{'; '.join(shared[:3])}")
    return found


def _live_threads(pid: int, *, settle_s: float = 0.05) -> int:
    """The threads of ``pid`` that are not exiting. A thread its code just joined can stay listed for a moment while
    the kernel finishes its exit (after it cleared its tid, which is what ``join`` waits for; it holds no user-space
    lock by then): a count above one is read again for up to ``settle_s`` before it is believed, and dead or zombie
    tasks never count."""
    deadline = time.monotonic() + settle_s
    while True:
        live = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue  # gone between the listing and the read
            live += state not in ("Z", "X")
        if live <= 1 or time.monotonic() >= deadline:
            return live
        time.sleep(0.002)


def _kill(pid: int | None) -> None:
    """SIGKILL and reap (as its tracer, or its parent): nothing half-made is left running, or as a zombie."""
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, WALL)
    except (ProcessLookupError, ChildProcessError):
        pass


def _fd_inode(pid: int, fd: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/fd/{fd}").st_ino
    except OSError:
        return None


def _fd_inodes(pid: int) -> set[int]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        inode = _fd_inode(pid, int(fd))
        if inode is not None:
            out.add(inode)
    return out


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _verify(pid: int, parent: int, channel_fd: int, channel_inode: int, channel: socket.socket,
            ids: tuple[int, int], cwd: str | None) -> None:
    """The set-up, read from outside: only the channel (whose peer is the copy) and /dev/null, new namespaces, its
    own session, the ids, no capability (none in its bounding set either), the working directory asked for."""
    fds = sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))
    problems = []
    if fds != sorted({0, 1, 2, channel_fd}):
        problems.append(f"descriptors {fds}")
    if _fd_inode(pid, channel_fd) != channel_inode:
        problems.append("the channel is not the new socket")
    peer_pid = struct.unpack("3i", channel.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    if peer_pid != pid:
        problems.append(f"the channel's other end was made by pid {peer_pid}")
    null = os.stat("/dev/null")
    for fd in {0, 1, 2} - {channel_fd}:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
            if not stat.S_ISCHR(st.st_mode) or st.st_rdev != null.st_rdev:
                problems.append(f"fd {fd} is not /dev/null")
        except OSError:
            problems.append(f"fd {fd} is gone")
    for name in ("user", "pid_for_children", "mnt", "ipc", "net", "uts"):
        if os.readlink(f"/proc/{pid}/ns/{name}") == os.readlink(f"/proc/{parent}/ns/{name}"):
            problems.append(f"{name} namespace not new")
    if cwd is not None:
        here, there = os.stat(f"/proc/{pid}/cwd"), os.stat(f"/proc/{pid}/root/{cwd.lstrip('/')}")
        if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
            problems.append(f"working directory is not {cwd}")
    status = _status(pid)
    for key in ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd"):
        if int(status.get(key, "1"), 16) != 0:
            problems.append(f"{key} {status.get(key)}")
    if status.get("NoNewPrivs", "0").strip() != "1":
        problems.append("no_new_privs is not set")
    uids, gids = status.get("Uid", "").split(), status.get("Gid", "").split()
    if uids != [str(ids[0])] * 4 or gids != [str(ids[1])] * 4:
        problems.append(f"ids {uids} / {gids}, expected {ids}")
    with open(f"/proc/{pid}/stat") as f:
        session = int(f.read().rsplit(")", 1)[1].split()[3])
    if session != pid:
        problems.append(f"session {session}")
    if problems:
        raise CowForkError(f"the copy's set-up did not hold (read from /proc/{pid}): " + "; ".join(problems))


def _write_id_maps(pid: int, uid_map: str, gid_map: str) -> None:
    for name, text in (("setgroups", "deny"), ("uid_map", uid_map), ("gid_map", gid_map)):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(text)


@dataclass
class Forked:
    """A copy made by :func:`cow_fork`.

    Attributes:
        pid: the copy's pid as the caller sees it (it is pid 1 in its own pid namespace).
        channel: the caller's end of the copy's new channel (the copy has the other end at ``channel_fd``).
        parent_stopped_s: how long the parent was stopped.
        ready_s: from the start until the copy ran on, set up.
        pidfd: a pidfd of the copy (``cow_fork(..., pidfd=True)``), else None.
    """

    pid: int
    channel: socket.socket
    parent_stopped_s: float
    ready_s: float
    pidfd: int | None = None


def cow_fork(pid: int, *, channel_fd: int, channel_type: int = socket.SOCK_STREAM, uid: int | None = None,
             gid: int | None = None, inner_ids: tuple[int, int] | None = None, reparent: bool = True,
             write_id_maps: Callable[[int, str, str], None] | None = None, cwd: str | None = None,
             writable_paths: tuple[str, ...] = (), seccomp_filters: int | None = None,
             setup: Callable[[Tracee], None] | None = None, map_outer_ids: tuple[int, int] | None = None,
             pidfd: bool = False, reap: bool = False, target_pidfd: int | None = None) -> Forked:
    """A copy-on-write copy of the running process ``pid`` (its main thread's state and all its memory), in
    namespaces of its own (:data:`NAMESPACES`), set up by the tracer before it runs.

    The copy resumes where ``pid`` was (e.g. blocked reading its channel) with: a new ``AF_UNIX`` socket pair of
    ``channel_type`` at ``channel_fd`` (the caller gets the other end), ``/dev/null`` at 0, 1 and 2 (unless one is the
    channel), every other descriptor closed, its own session, its user namespace mapping its old uid/gid number to
    host ``uid``/``gid`` (default: the same ids as ``pid``'s: an unprivileged caller can map only its own), and no
    capabilities. ``inner_ids``: the uid and gid the process sees itself as (in its own user namespace; default: as
    this process sees them, right where both are in the same namespace); the copy sees the same.
    ``write_id_maps(copy_pid, uid_map, gid_map)``: writes the copy's ``/proc/PID/{setgroups,uid_map,gid_map}``
    (default: this process does; the kernel takes them only from a process in the user namespace ``pid`` is in or
    its parent's, so for a process in a nested one, e.g. a sandbox's, a process in there must). ``reparent``: the
    copy's parent is ``pid``'s parent (``CLONE_PARENT``; not possible when ``pid`` is the init of a pid namespace), so
    it outlives ``pid``. ``setup(tracee)`` may inject more (e.g. mount a fresh scratch dir) before the copy is let go;
    ``cwd``: then the copy's working directory (e.g. that fresh scratch dir: the old one is the parent's).
    ``writable_paths``, ``seccomp_filters``: see :func:`hazards`. ``map_outer_ids``: the outer uid and gid as the map
    writer sees them (default ``uid``/``gid``; e.g. a writer inside a sandbox's user namespace sees other numbers
    than this process). ``pidfd``: also open a pidfd of the copy (``Forked.pidfd``; the caller closes it) while it is
    still stopped, so it names the copy even after the copy ends and is reaped. ``reap``: first reap, in the stopped
    process, its children that have ended (``wait4(-1, WNOHANG)``: earlier copies, which are its children when it
    cannot use ``CLONE_PARENT`` and never waits for them itself). ``target_pidfd``: a pidfd of ``pid`` taken when it
    was known to be the right process: checked once it is stopped (it must still be alive), so a pid that ended and was
    reused meanwhile is never copied.

    Nothing the copy reports is taken on trust: before it is let go, its descriptors, channel, ids, session and
    capabilities are read from ``/proc`` (a process can answer an injected call itself, through a seccomp filter of its
    own: a sandbox should deny the REPL ``seccomp()``/``PR_SET_SECCOMP`` and pass ``seccomp_filters``). A tracee that
    blocks an injected call for :data:`~gym_llm.tools.sandbox.ptrace.STOP_TIMEOUT_S` is killed.

    Cost (``bench/fork.py``, 2-core AMD EPYC): the parent is stopped 4–9 ms for a ~150 MB Python process (page
    tables are copied, not pages); the copy runs, set up and checked, 6–16 ms after the start.

    Raises:
        CowForkError: not supported here (:func:`unsupported_reason`), a copy would not be its own (:func:`hazards`:
            checked again while the process is stopped), the process ended, or a set-up step failed (then the copy
            is killed and the parent runs on as before).
    """
    reason = unsupported_reason()
    if reason:
        raise CowForkError(reason)
    try:
        found = hazards(pid, writable_paths=writable_paths, seccomp_filters=seccomp_filters)
    except OSError as e:
        raise CowForkError(f"cannot stop pid {pid} to fork it: {e}") from e
    if found:
        raise CowForkError(f"pid {pid} is not copied: " + "; ".join(found))
    watchdog = Watchdog()
    try:
        started = time.perf_counter()
        flags = NAMESPACES | signal.SIGCHLD | (CLONE_PARENT if reparent else 0)
        try:
            parent = Tracee(pid, options=O_TRACESYSGOOD | O_TRACEFORK | O_TRACESECCOMP | O_EXITKILL,
                            watchdog=watchdog)
        except (OSError, TraceError) as e:
            raise CowForkError(f"cannot stop pid {pid} to fork it: {e}") from e
        try:
            if target_pidfd is not None:
                try:  # still alive, so the process just stopped is the one the pidfd names (its pid is not free)
                    signal.pidfd_send_signal(target_pidfd, 0)
                except ProcessLookupError:
                    raise CowForkError(f"pid {pid} ended before it could be forked") from None
            seen_ids = _ids(pid)
            # again, now that it is stopped (its only thread): nothing can start a thread or map memory meanwhile
            found = hazards(pid, writable_paths=writable_paths, seccomp_filters=seccomp_filters)
            if found:
                raise CowForkError(f"pid {pid} is not copied: " + "; ".join(found))
            parent_inodes = _fd_inodes(pid)
        except BaseException as e:
            try:
                parent.detach()
            except OSError:
                pass  # it ended meanwhile
            if isinstance(e, OSError):
                raise CowForkError(f"pid {pid} could not be read while stopped: {e}") from e
            raise
        inner_uid, inner_gid = inner_ids if inner_ids is not None else seen_ids
        child = None
        try:
            if reap:
                for _ in range(4096):  # a bound: each call reaps one
                    try:
                        if parent.call("wait4", 0xFFFFFFFFFFFFFFFF, 0, _WNOHANG, 0) <= 0:
                            break
                    except OSError:  # ECHILD: none left
                        break
            for attempt in range(3):
                try:
                    parent.call("clone", flags, 0, 0, 0, 0)
                    break
                except OSError as e:  # ERESTARTNOINTR: a signal (held, sent again later) came first: once more
                    if e.errno != _ERESTARTNOINTR or attempt == 2 or parent.forked is not None:
                        raise CowForkError(f"clone in pid {pid} failed: {e}") from e
                finally:
                    child = parent.forked
            if child is None:
                raise CowForkError(f"pid {pid} made no copy (the kernel reported no fork event)")
            parent.detach()
        except BaseException as e:
            _kill(child)
            if isinstance(e, Stuck):  # it blocks a call it was made to make: hostile, and not left half-traced
                _kill(pid)
                raise CowForkError(f"{e}; pid {pid} was killed") from e
            try:
                parent.detach()
            except (OSError, TraceError):
                pass  # it ended meanwhile
            if isinstance(e, TraceError) and not isinstance(e, CowForkError):
                raise CowForkError(f"clone in pid {pid} failed: {e}") from e
            raise
        stopped_s = time.perf_counter() - started
        channel = None
        try:
            wait_stop(child, watchdog)  # the copy starts stopped, traced by this thread: it has run nothing yet
            tracee = Tracee(child, options=O_TRACESYSGOOD | O_TRACESECCOMP | O_EXITKILL, seized=True,
                            resume_as=parent.stopped, syscall_at=parent.syscall_at, watchdog=watchdog)
            outer_uid = seen_ids[0] if uid is None else uid
            outer_gid = seen_ids[1] if gid is None else gid
            map_uid, map_gid = map_outer_ids if map_outer_ids is not None else (outer_uid, outer_gid)
            (write_id_maps or _write_id_maps)(child, f"{inner_uid} {map_uid} 1\n", f"{inner_gid} {map_gid} 1\n")
            tracee.call("setresgid", inner_gid, inner_gid, inner_gid)
            tracee.call("setresuid", inner_uid, inner_uid, inner_uid)
            tracee.call("setsid")
            try:  # a session keyring of its own (where the process may not use keyrings at all, there is none to share)
                tracee.call("keyctl", _KEYCTL_JOIN_SESSION_KEYRING, 0)
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOSYS, errno.EACCES):
                    raise
            scratch = tracee.call("mmap", 0, 4096, _PROT_READ_WRITE, _MAP_PRIVATE_ANONYMOUS, 0xFFFFFFFFFFFFFFFF, 0)
            tracee.call("socketpair", socket.AF_UNIX, channel_type | socket.SOCK_CLOEXEC, 0, scratch)
            pair = tracee.peek(scratch)
            theirs, ours = pair & 0xFFFFFFFF, pair >> 32
            new_sockets = {fd: _fd_inode(child, fd) for fd in (theirs, ours)}
            if theirs == ours or None in new_sockets.values() or set(new_sockets.values()) & parent_inodes:
                raise CowForkError(f"the copy's new socket pair is not new ({theirs}, {ours}): its result was forged")
            pidfd = os.pidfd_open(child)
            try:
                taken = libc.syscall(438, pidfd, ours, 0)  # pidfd_getfd
                if taken < 0:
                    raise OSError(ctypes.get_errno(), f"pidfd_getfd: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(pidfd)
            channel = socket.socket(fileno=taken)
            tracee.call("dup2", theirs, channel_fd)
            tracee.poke(scratch, b"/dev/null\0")
            null = tracee.call("openat", _AT_FDCWD & 0xFFFFFFFFFFFFFFFF, scratch, _O_RDWR | _O_CLOEXEC)
            for fd in (0, 1, 2):
                if fd != channel_fd:
                    tracee.call("dup2", null, fd)
            keep = sorted({0, 1, 2, channel_fd})
            for low, high in zip(keep, keep[1:] + [0xFFFFFFFF + 1]):
                if high - 1 >= low + 1:
                    tracee.call("close_range", low + 1, high - 1, 0)
            if setup is not None:
                setup(tracee)
            if cwd is not None:
                tracee.poke(scratch, os.fsencode(cwd) + b"\0")
                tracee.call("chdir", scratch)
            # no way back to a capability, even through execve: no_new_privs (file capabilities and set-id bits
            # grant nothing) and securebits locked (uid 0 in its namespace is not privileged on exec)
            tracee.call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            tracee.call("prctl", _PR_SET_SECUREBITS, _SECURE_ALL, 0, 0, 0)
            for cap in range(_last_capability() + 1):  # a new user namespace starts with a full bounding set
                tracee.call("prctl", _PR_CAPBSET_DROP, cap, 0, 0, 0)
            capabilities = struct.pack("<Ii", _LINUX_CAPABILITY_VERSION_3, 0) + b"\0" * 24  # header, 2 empty data sets
            tracee.poke(scratch, capabilities)
            tracee.call("capset", scratch, scratch + 8)
            tracee.call("munmap", scratch, 4096)
            _verify(child, pid, channel_fd, new_sockets[theirs], channel, (outer_uid, outer_gid), cwd)  # not its word
            handle = os.pidfd_open(child) if pidfd else None
            try:
                tracee.detach()
            except BaseException:
                if handle is not None:
                    os.close(handle)
                raise
        except BaseException as e:
            _kill(child)
            if channel is not None:
                channel.close()
            if isinstance(e, (CowForkError, KeyboardInterrupt)):
                raise
            raise CowForkError(f"setting up the copy of pid {pid} failed: {type(e).__name__}: {e}") from e
        return Forked(pid=child, channel=channel, parent_stopped_s=stopped_s, ready_s=time.perf_counter() - started,
                      pidfd=handle)
    finally:
        watchdog.close()
