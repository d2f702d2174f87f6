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

__all__ = ["CowForkError", "Forked", "Tracee", "cow_fork", "hazards", "unsupported_reason", "NAMESPACES",
           "GATED_SYSCALLS"]

# x86-64 syscall numbers
NR = {"read": 0, "close": 3, "mmap": 9, "munmap": 11, "dup2": 33, "getpid": 39, "socketpair": 53, "clone": 56,
      "chdir": 80, "keyctl": 250, "prctl": 157,
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
_SYSCALL_INSN = b"\x0f\x05"
_WALL = 0x40000000
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_AT_FDCWD = -100
_O_RDWR, _O_CLOEXEC = 2, 0o2000000
_PROT_READ_WRITE, _MAP_PRIVATE_ANONYMOUS = 3, 0x22
_SYSTEM_DIRS = ("/usr/", "/lib/", "/lib64/", "/etc/")
_STOP_TIMEOUT_S = 10.0
_FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGSYS, signal.SIGFPE, signal.SIGTRAP}
_USER_CS, _USER_SS, _TRAP_FLAG = 0x33, 0x2B, 0x100
_PR_SET_SECUREBITS, _PR_SET_NO_NEW_PRIVS = 28, 38
_SECURE_ALL = 0xEF  # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE, each with its lock
_KEYCTL_JOIN_SESSION_KEYRING = 1

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


def _wait_stop(pid: int, watchdog: _Watchdog | None = None) -> int:
    """The next ptrace stop of ``pid`` (``watchdog`` ends the wait of a tracee that does not stop in time)."""
    if watchdog is not None:
        watchdog.arm(pid)
    try:
        _, status = os.waitpid(pid, _WALL)
    finally:
        if watchdog is not None:
            watchdog.disarm()
    if not os.WIFSTOPPED(status):
        if watchdog is not None and watchdog.fired == pid:
            raise _Stuck(f"pid {pid} did not come back from an injected call within {_STOP_TIMEOUT_S:.0f} s")
        raise CowForkError(f"pid {pid} ended while being forked (wait status {status:#x})")
    return status


class _Watchdog:
    """Kills the tracee being worked on if it does not come back in time (a seccomp user-notification filter of its
    own, a wait it cannot leave): the blocked ``waitpid`` then returns. One thread per fork, armed per wait."""

    def __init__(self):
        import threading

        self.lock = threading.Condition()
        self.armed: tuple[int, float] | None = None
        self.fired: int | None = None
        self.closed = False
        self.thread: threading.Thread | None = None

    def arm(self, pid: int) -> None:
        import threading

        with self.lock:
            self.armed, self.fired = (pid, time.monotonic() + _STOP_TIMEOUT_S), None
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="cowfork-watchdog", daemon=True)
                self.thread.start()
            self.lock.notify()

    def disarm(self) -> None:
        with self.lock:
            self.armed = None
            self.lock.notify()

    def close(self) -> None:
        with self.lock:
            self.armed, self.closed = None, True
            self.lock.notify()

    def _run(self) -> None:
        with self.lock:
            while not self.closed:
                if self.armed is None:
                    self.lock.wait()
                    continue
                pid, deadline = self.armed
                left = deadline - time.monotonic()
                if left > 0:
                    self.lock.wait(timeout=left)
                    continue
                self.fired, self.armed = pid, None
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


class _Stuck(CowForkError):
    """A tracee did not come back from an injected call in time."""


class Tracee:
    """One stopped, seized thread and the syscalls injected into it (at a ``syscall`` instruction it already has).

    ``resume_as``: the registers it gets back at :meth:`detach` (default: its own, taken when stopped). An interrupted
    blocking call (a ``read`` the process was waiting in) is restarted then, as the kernel would have.
    """

    def __init__(self, pid: int, *, options: int, seized: bool = False, resume_as: _Regs | None = None,
                 syscall_at: int | None = None, watchdog: _Watchdog | None = None):
        self.pid = pid
        self.watchdog = watchdog
        self.at_entry = False  # stopped at the entry of an injected call (an error in between)
        self.forked: int | None = None
        self.held_signals: list[int] = []  # signals that arrived while it was stopped: sent again after detach
        if not seized:
            _ptrace(_PTRACE_SEIZE, pid, 0, options)
            try:
                self._interrupt()
            except BaseException:
                _ptrace_quiet(_PTRACE_DETACH, pid)  # seized but not stopped (it ended, or is stuck): let go
                raise
        else:
            _ptrace(_PTRACE_SETOPTIONS, pid, 0, options)
        try:
            self.stopped = self.regs()
            self.resume_as = resume_as if resume_as is not None else self.stopped
            self.syscall_at = syscall_at if syscall_at is not None else self._syscall_instruction()
        except BaseException:
            if not seized:
                _ptrace_quiet(_PTRACE_DETACH, pid)  # stopped, registers untouched: it goes on as it was
            raise

    def _interrupt(self) -> None:
        _ptrace(_PTRACE_INTERRUPT, self.pid)
        while True:
            status = _wait_stop(self.pid, self.watchdog)
            if status >> 16 == _EVENT_STOP:
                return
            # a signal on its way in: hold it (sent again after detach) and go on to the interrupt's stop
            self.held_signals.append(os.WSTOPSIG(status))
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
        executable = _executable_ranges(self.pid, own_lib)
        for path, start in _mappings(self.pid):
            if path == own_lib:
                address = start + (own - own_base) + offset_in_function
                if any(low <= address < high - 1 for low, high in executable) and \
                        (self.peek(address) & 0xFFFF) == 0x050F:
                    return address
        raise CowForkError(f"pid {self.pid} does not map {own_lib} (the C library this process uses)")

    def call(self, name: str, *args: int) -> int:
        """Run syscall ``name`` with ``args`` in the tracee; its result (an ``OSError`` for a -errno)."""
        regs = _Regs.from_buffer_copy(self.stopped)
        regs.rax, regs.orig_rax, regs.rip = NR[name], 0xFFFFFFFFFFFFFFFF, self.syscall_at
        regs.cs, regs.ss, regs.eflags = _USER_CS, _USER_SS, regs.eflags & ~_TRAP_FLAG  # 64-bit mode, no single-step
        for register, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args):
            setattr(regs, register, value & 0xFFFFFFFFFFFFFFFF)
        self._set_regs(regs)
        intended = regs
        _ptrace(_PTRACE_SYSCALL, self.pid)
        syscall_stops = 0
        while True:  # syscall-entry stop, a seccomp stop if the filter gates it, a fork event, the exit stop
            status = _wait_stop(self.pid, self.watchdog)
            event, sig = status >> 16, os.WSTOPSIG(status)
            if event == _EVENT_FORK:
                message = ctypes.c_ulong()
                _ptrace(_PTRACE_GETEVENTMSG, self.pid, 0, ctypes.addressof(message))
                self.forked = message.value
            elif event == _EVENT_SECCOMP:
                self._check_entry(name)  # the gate: the tracer is here, so *this* call goes on
            elif sig == signal.SIGTRAP | 0x80:
                syscall_stops += 1
                if syscall_stops == 1:
                    self.at_entry = True
                    self._check_entry(name)
                    # the arguments as intended, whatever the code at the call site did to the registers
                    entry = _Regs.from_buffer_copy(intended)
                    entry.orig_rax, entry.rax, entry.rip = NR[name], self.regs().rax, self.syscall_at + 2
                    self._set_regs(entry)
                else:
                    self.at_entry = False
                    result = _signed(self.regs().rax)
                    if -4096 < result < 0:
                        raise OSError(-result, f"{name} in pid {self.pid}: {os.strerror(-result)}")
                    return result
            elif event == 0 and sig in _FAULTS:  # the injected instruction faulted: nothing will make it pass
                raise CowForkError(f"{name} injected into pid {self.pid} faulted ({signal.Signals(sig).name})")
            elif event == 0:
                self.held_signals.append(sig)  # a signal arrived: held, sent again after detach
            _ptrace(_PTRACE_SYSCALL, self.pid)

    def _check_entry(self, name: str) -> None:
        regs = self.regs()
        if regs.orig_rax != NR[name] or regs.rip != self.syscall_at + 2:
            raise CowForkError(f"pid {self.pid} entered syscall {_signed(regs.orig_rax)} at {regs.rip:#x}, not the "
                               f"injected {name} ({NR[name]}) at {self.syscall_at + 2:#x}")

    def detach(self) -> None:
        """Give the thread back the registers of :attr:`resume_as` and let it run, untraced.

        It is first brought to a stop inside the kernel's signal handling (an interrupt), with its own registers back
        and the signals held meanwhile queued again: on resuming, the kernel itself restarts the call it was blocked
        in, or ends it with ``EINTR`` for a signal handler, exactly as if it had never been stopped."""
        if self.at_entry:  # an injected call was entered but not run: skip it (no syscall number) to its exit stop
            regs = self.regs()
            regs.orig_rax = 0xFFFFFFFFFFFFFFFF
            self._set_regs(regs)
            _ptrace(_PTRACE_SYSCALL, self.pid)
            while True:
                status = _wait_stop(self.pid, self.watchdog)
                if os.WSTOPSIG(status) == signal.SIGTRAP | 0x80:
                    break
                if status >> 16 == 0:
                    self.held_signals.append(os.WSTOPSIG(status))
                _ptrace(_PTRACE_SYSCALL, self.pid)
            self.at_entry = False
        self._set_regs(_Regs.from_buffer_copy(self.resume_as))
        _ptrace(_PTRACE_INTERRUPT, self.pid)
        _ptrace(_PTRACE_CONT, self.pid, 0, 0)
        while True:
            status = _wait_stop(self.pid, self.watchdog)
            if status >> 16 == _EVENT_STOP:
                break
            if status >> 16 == 0:
                self.held_signals.append(os.WSTOPSIG(status))  # on its way in: queued again below
            _ptrace(_PTRACE_CONT, self.pid, 0, 0)
        for sig in dict.fromkeys(self.held_signals):  # in order, once each (standard signals do not queue)
            os.kill(self.pid, sig)
        self.held_signals.clear()
        _ptrace(_PTRACE_DETACH, self.pid, 0, 0)


def _ptrace_quiet(request: int, pid: int) -> None:
    try:
        _ptrace(request, pid)
    except OSError:
        pass


def _executable_ranges(pid: int, path: str) -> list[tuple[int, int]]:
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == path and "x" in parts[1]:
                low, high = (int(x, 16) for x in parts[0].split("-"))
                out.append((low, high))
    return out


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
            under_writable = any(path == d or path.startswith(d.rstrip("/") + "/") for d in writable_paths)
            if parts[1][3] == "s" and ("w" in parts[1] or not path.startswith(_SYSTEM_DIRS)) or under_writable:
                shared.append(f"{parts[0]} {parts[1]} {path}")
    if shared:
        found.append(f"{len(shared)} shared or writable-file memory mapping(s) the copy would share with it: "
                     f"{'; '.join(shared[:3])}")
    return found


def _kill(pid: int | None) -> None:
    """SIGKILL and reap (as its tracer, or its parent): nothing half-made is left running, or as a zombie."""
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, _WALL)
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
    own session, the ids, no capability, the working directory asked for."""
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
    for key in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
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
    """

    pid: int
    channel: socket.socket
    parent_stopped_s: float
    ready_s: float


def cow_fork(pid: int, *, channel_fd: int, channel_type: int = socket.SOCK_STREAM, uid: int | None = None,
             gid: int | None = None, inner_ids: tuple[int, int] | None = None, reparent: bool = True,
             write_id_maps: Callable[[int, str, str], None] | None = None, cwd: str | None = None,
             writable_paths: tuple[str, ...] = (), seccomp_filters: int | None = None,
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
    it outlives ``pid``. ``setup(tracee)`` may inject more (e.g. mount a fresh scratch dir) before the copy is let go;
    ``cwd``: then the copy's working directory (e.g. that fresh scratch dir: the old one is the parent's).
    ``writable_paths``, ``seccomp_filters``: see :func:`hazards`.

    Nothing the copy reports is taken on trust: before it is let go, its descriptors, channel, ids, session and
    capabilities are read from ``/proc`` (a process can answer an injected call itself, through a seccomp filter of its
    own: a sandbox should deny the REPL ``seccomp()``/``PR_SET_SECCOMP`` and pass ``seccomp_filters``). A tracee that
    blocks an injected call for :data:`_STOP_TIMEOUT_S` is killed.

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
    watchdog = _Watchdog()
    try:
        started = time.perf_counter()
        flags = NAMESPACES | signal.SIGCHLD | (CLONE_PARENT if reparent else 0)
        try:
            parent = Tracee(pid, options=_O_TRACESYSGOOD | _O_TRACEFORK | _O_TRACESECCOMP | _O_EXITKILL,
                            watchdog=watchdog)
        except OSError as e:
            raise CowForkError(f"cannot stop pid {pid} to fork it: {e}") from e
        try:
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
            try:
                parent.call("clone", flags, 0, 0, 0, 0)
            except OSError as e:
                raise CowForkError(f"clone in pid {pid} failed: {e}") from e
            finally:
                child = parent.forked
            if child is None:
                raise CowForkError(f"pid {pid} made no copy (the kernel reported no fork event)")
            parent.detach()
        except BaseException as e:
            _kill(child)
            if isinstance(e, _Stuck):  # it blocks a call it was made to make: hostile, and not left half-traced
                _kill(pid)
                raise CowForkError(f"{e}; pid {pid} was killed") from e
            try:
                parent.detach()
            except OSError:
                pass  # it ended meanwhile
            raise
        stopped_s = time.perf_counter() - started
        channel = None
        try:
            _wait_stop(child, watchdog)  # the copy starts stopped, traced by this thread: it has run nothing yet
            tracee = Tracee(child, options=_O_TRACESYSGOOD | _O_TRACESECCOMP | _O_EXITKILL, seized=True,
                            resume_as=parent.stopped, syscall_at=parent.syscall_at, watchdog=watchdog)
            outer_uid = seen_ids[0] if uid is None else uid
            outer_gid = seen_ids[1] if gid is None else gid
            (write_id_maps or _write_id_maps)(child, f"{inner_uid} {outer_uid} 1\n", f"{inner_gid} {outer_gid} 1\n")
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
            if cwd is not None:
                tracee.poke(scratch, os.fsencode(cwd) + b"\0")
                tracee.call("chdir", scratch)
            # no way back to a capability, even through execve: no_new_privs (file capabilities and set-id bits
            # grant nothing) and securebits locked (uid 0 in its namespace is not privileged on exec)
            tracee.call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            tracee.call("prctl", _PR_SET_SECUREBITS, _SECURE_ALL, 0, 0, 0)
            capabilities = struct.pack("<Ii", _LINUX_CAPABILITY_VERSION_3, 0) + b"\0" * 24  # header, 2 empty data sets
            tracee.poke(scratch, capabilities)
            tracee.call("capset", scratch, scratch + 8)
            tracee.call("munmap", scratch, 4096)
            _verify(child, pid, channel_fd, new_sockets[theirs], channel, (outer_uid, outer_gid), cwd)  # not its word
            tracee.detach()
        except BaseException as e:
            _kill(child)
            if channel is not None:
                channel.close()
            if isinstance(e, (CowForkError, KeyboardInterrupt)):
                raise
            raise CowForkError(f"setting up the copy of pid {pid} failed: {type(e).__name__}: {e}") from e
        return Forked(pid=child, channel=channel, parent_stopped_s=stopped_s, ready_s=time.perf_counter() - started)
    finally:
        watchdog.close()
