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

Not thread-safe per tracee; every ptrace call of one fork must come from the thread that made it (the kernel ties a
tracee to the tracing thread), which :func:`cow_fork` does by running start to end in its caller's thread.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CowForkError", "Forked", "Tracee", "cow_fork", "hazards", "unsupported_reason", "NAMESPACES",
           "GATED_SYSCALLS"]

# x86-64 syscall numbers
NR = {"read": 0, "close": 3, "mmap": 9, "munmap": 11, "dup2": 33, "getpid": 39, "socketpair": 53, "clone": 56,
      "chdir": 80,
      "setsid": 112, "setresuid": 117, "setresgid": 119, "capset": 126, "mount": 165, "restart_syscall": 219,
      "openat": 257, "close_range": 436}
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_PARENT = 0x10000000, 0x20000000, 0x40000000, 0x8000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS
"""The namespaces every copy gets: user (its ids and capabilities are its own), pid (it is pid 1 of its own and sees
no other process), mount, IPC, network (nothing but a down loopback) and UTS."""
GATED_SYSCALLS = ("clone", "setresuid", "setresgid", "setsid", "capset", "mount", "close_range", "dup2", "openat",
                  "socketpair", "chdir")
"""What :func:`cow_fork` injects; a filter that gates the privileged ones with ``SECCOMP_RET_TRACE`` must let the
others through (the ones a REPL may make anyway are allowed by its own filter)."""

_PTRACE_PEEKDATA, _PTRACE_POKEDATA, _PTRACE_CONT, _PTRACE_DETACH = 2, 5, 7, 17
_PTRACE_GETREGS, _PTRACE_SETREGS, _PTRACE_SYSCALL = 12, 13, 24
_PTRACE_SETOPTIONS, _PTRACE_GETEVENTMSG, _PTRACE_SEIZE, _PTRACE_INTERRUPT = 0x4200, 0x4201, 0x4206, 0x4207
_O_TRACESYSGOOD, _O_TRACEFORK, _O_TRACESECCOMP, _O_EXITKILL = 1, 2, 0x80, 1 << 20
_EVENT_FORK, _EVENT_SECCOMP, _EVENT_STOP = 1, 7, 128
_ERESTART = {512: None, 513: None, 514: None, 516: NR["restart_syscall"]}  # -ERESTART*: redo the interrupted call
_SYSCALL_INSN = b"\x0f\x05"
_WALL = 0x40000000
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_AT_FDCWD = -100
_O_RDWR, _O_CLOEXEC = 2, 0o2000000
_PROT_READ_WRITE, _MAP_PRIVATE_ANONYMOUS = 3, 0x22
_SYSTEM_DIRS = ("/usr/", "/lib/", "/lib64/", "/etc/")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.syscall.restype = ctypes.c_long


class CowForkError(RuntimeError):
    """The copy could not be made; the parent is left running as it was and no copy is left behind."""


class _Regs(ctypes.Structure):  # struct user_regs_struct (x86-64)
    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base ds es "
        "fs gs").split()]


def unsupported_reason() -> str | None:
    """Why :func:`cow_fork` cannot run here (None: it can)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"copy-on-write forks inject x86-64 syscalls; this is {platform.system()} on {platform.machine()}"
    release = tuple(int(p) for p in platform.release().split(".")[:2] if p.isdigit())
    if release < (5, 6):
        return f"copy-on-write forks need Linux >= 5.6 (pidfd_getfd); this kernel is {platform.release()}"
    return None


def _ptrace(request: int, pid: int, addr: int = 0, data: int = 0) -> int:
    ctypes.set_errno(0)
    result = _libc.ptrace(request, pid, ctypes.c_void_p(addr), ctypes.c_void_p(data))
    err = ctypes.get_errno()
    if result == -1 and err:
        raise OSError(err, f"ptrace({request:#x}, pid {pid}): {os.strerror(err)}")
    return result


def _signed(value: int) -> int:
    return ctypes.c_longlong(value).value


def _wait_stop(pid: int) -> int:
    _, status = os.waitpid(pid, _WALL)
    if not os.WIFSTOPPED(status):
        raise CowForkError(f"pid {pid} ended while being forked (wait status {status:#x})")
    return status


class Tracee:
    """One stopped, seized thread and the syscalls injected into it (at a ``syscall`` instruction it already has).

    ``resume_as``: the registers it gets back at :meth:`detach` (default: its own, taken when stopped). An interrupted
    blocking call (a ``read`` the process was waiting in) is restarted then, as the kernel would have.
    """

    def __init__(self, pid: int, *, options: int, seized: bool = False, resume_as: _Regs | None = None):
        self.pid = pid
        self.forked: int | None = None
        self.pending_signal = 0  # a signal that arrived while stopped: delivered at detach
        if not seized:
            _ptrace(_PTRACE_SEIZE, pid, 0, options)
            self._interrupt()
        else:
            _ptrace(_PTRACE_SETOPTIONS, pid, 0, options)
        self.stopped = self.regs()
        self.resume_as = resume_as if resume_as is not None else self.stopped
        self.syscall_at = self._syscall_instruction()

    def _interrupt(self) -> None:
        _ptrace(_PTRACE_INTERRUPT, self.pid)
        while True:
            status = _wait_stop(self.pid)
            if status >> 16 == _EVENT_STOP:
                return
            # a signal on its way in: hold it (delivered at detach) and go on to the interrupt's stop
            self.pending_signal = os.WSTOPSIG(status)
            _ptrace(_PTRACE_CONT, self.pid, 0, 0)

    def regs(self) -> _Regs:
        regs = _Regs()
        _ptrace(_PTRACE_GETREGS, self.pid, 0, ctypes.addressof(regs))
        return regs

    def _set_regs(self, regs: _Regs) -> None:
        _ptrace(_PTRACE_SETREGS, self.pid, 0, ctypes.addressof(regs))

    def peek(self, address: int) -> int:
        ctypes.set_errno(0)
        value = _libc.ptrace(_PTRACE_PEEKDATA, self.pid, ctypes.c_void_p(address), None)
        if value == -1 and ctypes.get_errno():
            raise OSError(ctypes.get_errno(), f"peek at {address:#x} of pid {self.pid}")
        return value & 0xFFFFFFFFFFFFFFFF

    def poke(self, address: int, data: bytes) -> None:
        data += b"\0" * (-len(data) % 8)
        for offset in range(0, len(data), 8):
            _ptrace(_PTRACE_POKEDATA, self.pid, address + offset, struct.unpack("<Q", data[offset:offset + 8])[0])

    def _syscall_instruction(self) -> int:
        """Where a ``syscall`` instruction is: right before the instruction pointer when the thread was stopped in a
        system call (a blocked read), else in the C library's ``syscall()`` (the same file is mapped in every
        process of this machine's Python; found by its offset in this process's copy)."""
        here = self.stopped.rip - 2
        if _signed(self.stopped.orig_rax) >= 0 and (self.peek(here) & 0xFFFF) == 0x050F:
            return here
        own = ctypes.cast(_libc.syscall, ctypes.c_void_p).value
        code = ctypes.string_at(own, 128)
        offset_in_function = code.find(_SYSCALL_INSN)
        own_lib, own_base = _mapping_of(os.getpid(), own)
        if offset_in_function < 0 or own_lib is None:
            raise CowForkError("no syscall instruction found in this process's C library")
        for path, start in _mappings(self.pid):
            if path == own_lib:
                address = start + (own - own_base) + offset_in_function
                if (self.peek(address) & 0xFFFF) == 0x050F:
                    return address
        raise CowForkError(f"pid {self.pid} does not map {own_lib} (the C library this process uses)")

    def call(self, name: str, *args: int) -> int:
        """Run syscall ``name`` with ``args`` in the tracee; its result (an ``OSError`` for a -errno)."""
        regs = _Regs.from_buffer_copy(self.stopped)
        regs.rax, regs.orig_rax, regs.rip = NR[name], 0xFFFFFFFFFFFFFFFF, self.syscall_at
        for register, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args):
            setattr(regs, register, value & 0xFFFFFFFFFFFFFFFF)
        self._set_regs(regs)
        _ptrace(_PTRACE_SYSCALL, self.pid)
        syscall_stops = 0
        while True:  # syscall-entry stop, a seccomp stop if the filter gates it, a fork event, the exit stop
            status = _wait_stop(self.pid)
            event, sig = status >> 16, os.WSTOPSIG(status)
            if event == _EVENT_FORK:
                message = ctypes.c_ulong()
                _ptrace(_PTRACE_GETEVENTMSG, self.pid, 0, ctypes.addressof(message))
                self.forked = message.value
            elif event == _EVENT_SECCOMP:
                pass  # the gate: the tracer is here, so the call goes on
            elif sig == signal.SIGTRAP | 0x80:
                syscall_stops += 1
                if syscall_stops == 2:
                    result = _signed(self.regs().rax)
                    if -4096 < result < 0:
                        raise OSError(-result, f"{name} in pid {self.pid}: {os.strerror(-result)}")
                    return result
            elif event == 0:
                self.pending_signal = sig  # a signal arrived: hold it for detach
            _ptrace(_PTRACE_SYSCALL, self.pid)

    def detach(self) -> None:
        """Give the thread back the registers of :attr:`resume_as` (restarting the blocking call it was in) and let
        it run, untraced."""
        regs = _Regs.from_buffer_copy(self.resume_as)
        rax = _signed(regs.rax)
        if -rax in _ERESTART and _signed(regs.orig_rax) >= 0:
            regs.rax = _ERESTART[-rax] if _ERESTART[-rax] is not None else regs.orig_rax
            regs.rip -= 2
            regs.orig_rax = 0xFFFFFFFFFFFFFFFF
        self._set_regs(regs)
        _ptrace(_PTRACE_DETACH, self.pid, 0, self.pending_signal)


def _mappings(pid: int) -> list[tuple[str, int]]:
    """(path, start) of each file mapping of ``pid`` at file offset 0 (a library's base)."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and int(parts[2], 16) == 0:
                out.append((parts[5].strip(), int(parts[0].split("-")[0], 16)))
    return out


def _mapping_of(pid: int, address: int) -> tuple[str | None, int]:
    """The file mapped at ``address`` in ``pid`` and that file's base address."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if start <= address < end and len(parts) == 6:
                path = parts[5].strip()
                return path, dict(_mappings(pid)).get(path, start)
    return None, 0


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


def hazards(pid: int) -> list[str]:
    """Why a copy of ``pid`` would not be its own (empty: none): other threads, shared memory mappings."""
    found = []
    threads = len(os.listdir(f"/proc/{pid}/task"))
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
            if parts[1][3] == "s" and ("w" in parts[1] or not path.startswith(_SYSTEM_DIRS)):
                shared.append(f"{parts[0]} {parts[1]} {path}")
    if shared:
        found.append(f"{len(shared)} shared memory mapping(s) the copy would share with it: {'; '.join(shared[:3])}")
    return found


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
    """

    pid: int
    channel: socket.socket
    parent_stopped_s: float
    ready_s: float


def cow_fork(pid: int, *, channel_fd: int, channel_type: int = socket.SOCK_STREAM, uid: int | None = None,
             gid: int | None = None, inner_ids: tuple[int, int] | None = None, reparent: bool = True,
             write_id_maps: Callable[[int, str, str], None] | None = None,
             setup: Callable[[Tracee], None] | None = None) -> Forked:
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
    it outlives ``pid``. ``setup(tracee)`` may inject more (e.g. mount a fresh scratch dir) before the copy is let go.

    Cost (``bench/fork.py``, 2-core AMD EPYC): the parent is stopped 4–6 ms for a ~150 MB Python process (page
    tables are copied, not pages); the copy runs, set up, 5–8 ms after the start.

    Raises:
        CowForkError: not supported here (:func:`unsupported_reason`), a copy would not be its own (:func:`hazards`:
            checked again while the process is stopped), the process ended, or a set-up step failed (then the copy
            is killed and the parent runs on as before).
    """
    reason = unsupported_reason()
    if reason:
        raise CowForkError(reason)
    try:
        found = hazards(pid)
    except OSError as e:
        raise CowForkError(f"cannot stop pid {pid} to fork it: {e}") from e
    if found:
        raise CowForkError(f"pid {pid} is not copied: " + "; ".join(found))
    started = time.perf_counter()
    flags = NAMESPACES | signal.SIGCHLD | (CLONE_PARENT if reparent else 0)
    try:
        parent = Tracee(pid, options=_O_TRACESYSGOOD | _O_TRACEFORK | _O_TRACESECCOMP | _O_EXITKILL)
    except OSError as e:
        raise CowForkError(f"cannot stop pid {pid} to fork it: {e}") from e
    child = None
    try:
        seen_ids = _ids(pid)
        found = hazards(pid)  # again, now that it is stopped: it cannot start a thread or map memory meanwhile
        if found:
            raise CowForkError(f"pid {pid} is not copied: " + "; ".join(found))
    except BaseException:
        parent.detach()
        raise
    inner_uid, inner_gid = inner_ids if inner_ids is not None else seen_ids
    try:
        try:
            parent.call("clone", flags, 0, 0, 0, 0)
        except OSError as e:
            raise CowForkError(f"clone in pid {pid} failed: {e}") from e
        child = parent.forked
    finally:
        parent.detach()
    stopped_s = time.perf_counter() - started
    if child is None:
        raise CowForkError(f"pid {pid} made no copy (the kernel reported no fork event)")
    try:
        _wait_stop(child)  # the copy starts stopped, traced by this thread: it has run nothing yet
        tracee = Tracee(child, options=_O_TRACESYSGOOD | _O_TRACESECCOMP | _O_EXITKILL, seized=True,
                        resume_as=parent.stopped)
        tracee.syscall_at = parent.syscall_at
        outer_uid = seen_ids[0] if uid is None else uid
        outer_gid = seen_ids[1] if gid is None else gid
        (write_id_maps or _write_id_maps)(child, f"{inner_uid} {outer_uid} 1\n", f"{inner_gid} {outer_gid} 1\n")
        tracee.call("setresgid", inner_gid, inner_gid, inner_gid)
        tracee.call("setresuid", inner_uid, inner_uid, inner_uid)
        tracee.call("setsid")
        scratch = tracee.call("mmap", 0, 4096, _PROT_READ_WRITE, _MAP_PRIVATE_ANONYMOUS, 0xFFFFFFFFFFFFFFFF, 0)
        tracee.call("socketpair", socket.AF_UNIX, channel_type | socket.SOCK_CLOEXEC, 0, scratch)
        pair = tracee.peek(scratch)
        theirs, ours = pair & 0xFFFFFFFF, pair >> 32
        pidfd = os.pidfd_open(child)
        try:
            taken = _libc.syscall(438, pidfd, ours, 0)  # pidfd_getfd
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
        capabilities = struct.pack("<Ii", _LINUX_CAPABILITY_VERSION_3, 0) + b"\0" * 24  # header, 2 empty data sets
        tracee.poke(scratch, capabilities)
        tracee.call("capset", scratch, scratch + 8)
        tracee.call("munmap", scratch, 4096)
        tracee.detach()
    except BaseException as e:
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, _WALL)  # as its tracer (and its parent with ``reparent``): no zombie is left
            except (ProcessLookupError, ChildProcessError):
                pass
        if isinstance(e, (CowForkError, KeyboardInterrupt)):
            raise
        raise CowForkError(f"setting up the copy of pid {pid} failed: {type(e).__name__}: {e}") from e
    return Forked(pid=child, channel=channel, parent_stopped_s=stopped_s, ready_s=time.perf_counter() - started)
