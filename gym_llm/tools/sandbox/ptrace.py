"""Syscall injection into a stopped thread with ptrace (x86-64 Linux): the mechanism under
:mod:`gym_llm.tools.sandbox.cowfork`.

:class:`Tracee` seizes and interrupts a thread (or takes one already stopped), runs syscalls in it at a ``syscall``
instruction it already has, and lets it go with its own registers back, so that the call it was blocked in is
restarted — or ended with ``EINTR`` for a signal that arrived meanwhile — by the kernel itself. It trusts nothing
the tracee does: each injected call is checked at its entry stop and its arguments are written there, a fault
ends it, and a :class:`Watchdog` kills a tracee that does not stop in time (a seccomp user-notification filter of its
own, a wait it cannot leave) so the tracer never hangs.

Every ptrace call on one tracee must come from the thread that attached it (the kernel ties a tracee to the tracing
thread), and nothing else in the process may ``waitpid`` on it meanwhile (it would take the ptrace stops).
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import time

__all__ = ["NR", "Regs", "Stuck", "TraceError", "Tracee", "Watchdog", "libc", "wait_stop"]

# x86-64 syscall numbers (the ones injected here and by callers' set-up hooks)
NR = {"mmap": 9, "munmap": 11, "dup2": 33, "socketpair": 53, "clone": 56, "wait4": 61, "chdir": 80, "setsid": 112,
      "setresuid": 117, "setresgid": 119, "capset": 126, "prctl": 157, "mount": 165, "keyctl": 250, "openat": 257,
      "close_range": 436}
_PTRACE_PEEKDATA, _PTRACE_POKEDATA, _PTRACE_CONT, _PTRACE_DETACH = 2, 5, 7, 17
_PTRACE_GETREGS, _PTRACE_SETREGS, _PTRACE_SYSCALL = 12, 13, 24
_PTRACE_SETOPTIONS, _PTRACE_GETEVENTMSG, _PTRACE_SEIZE, _PTRACE_INTERRUPT = 0x4200, 0x4201, 0x4206, 0x4207
O_TRACESYSGOOD, O_TRACEFORK, O_TRACESECCOMP, O_EXITKILL = 1, 2, 0x80, 1 << 20
_EVENT_FORK, _EVENT_SECCOMP, _EVENT_STOP = 1, 7, 128
_SYSCALL_INSN = b"\x0f\x05"
WALL = 0x40000000
STOP_TIMEOUT_S = 10.0
"""How long a tracee may take to stop after an injected call before the :class:`Watchdog` kills it."""
_FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGSYS, signal.SIGFPE, signal.SIGTRAP}
_USER_CS, _USER_SS, _TRAP_FLAG = 0x33, 0x2B, 0x100

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.syscall.restype = ctypes.c_long


class TraceError(RuntimeError):
    """An injected call could not be made (the tracee faulted, entered another call, or did not come back)."""


class Regs(ctypes.Structure):  # struct user_regs_struct (x86-64)
    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base ds es "
        "fs gs").split()]


def ptrace(request: int, pid: int, addr: int = 0, data: int = 0) -> int:
    ctypes.set_errno(0)
    result = libc.ptrace(request, pid, ctypes.c_void_p(addr), ctypes.c_void_p(data))
    err = ctypes.get_errno()
    if result == -1 and err:
        raise OSError(err, f"ptrace({request:#x}, pid {pid}): {os.strerror(err)}")
    return result


def signed(value: int) -> int:
    return ctypes.c_longlong(value).value


def wait_stop(pid: int, watchdog: Watchdog | None = None) -> int:
    """The next ptrace stop of ``pid`` (``watchdog`` ends the wait of a tracee that does not stop in time)."""
    if watchdog is not None:
        watchdog.arm(pid)
    try:
        _, status = os.waitpid(pid, WALL)
    finally:
        if watchdog is not None:
            watchdog.disarm()
    if not os.WIFSTOPPED(status):
        if watchdog is not None and watchdog.fired == pid:
            raise Stuck(f"pid {pid} did not come back from an injected call within {STOP_TIMEOUT_S:.0f} s")
        raise TraceError(f"pid {pid} ended while being forked (wait status {status:#x})")
    return status


class Watchdog:
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
            self.armed, self.fired = (pid, time.monotonic() + STOP_TIMEOUT_S), None
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


class Stuck(TraceError):
    """A tracee did not come back from an injected call in time."""


class Tracee:
    """One stopped, seized thread and the syscalls injected into it (at a ``syscall`` instruction it already has).

    ``resume_as``: the registers it gets back at :meth:`detach` (default: its own, taken when stopped). An interrupted
    blocking call (a ``read`` the process was waiting in) is restarted then, as the kernel would have.
    """

    def __init__(self, pid: int, *, options: int, seized: bool = False, resume_as: Regs | None = None,
                 syscall_at: int | None = None, watchdog: Watchdog | None = None):
        self.pid = pid
        self.watchdog = watchdog
        self.at_entry = False  # stopped at the entry of an injected call (an error in between)
        self.forked: int | None = None
        self.held_signals: list[int] = []  # signals that arrived while it was stopped: sent again after detach
        if not seized:
            # no options until it is stopped: with PTRACE_O_TRACESECCOMP set while it still runs, a call its filter
            # gates (SECCOMP_RET_TRACE) would stop for this tracer instead of failing with ENOSYS
            ptrace(_PTRACE_SEIZE, pid, 0, 0)
            try:
                self._interrupt()
                ptrace(_PTRACE_SETOPTIONS, pid, 0, options)
            except BaseException:
                ptrace_quiet(_PTRACE_DETACH, pid)  # seized but not stopped (it ended, or is stuck): let go
                raise
        else:
            ptrace(_PTRACE_SETOPTIONS, pid, 0, options)
        try:
            self.stopped = self.regs()
            self.resume_as = resume_as if resume_as is not None else self.stopped
            self.syscall_at = syscall_at if syscall_at is not None else self._syscall_instruction()
        except BaseException:
            if not seized:
                ptrace_quiet(_PTRACE_DETACH, pid)  # stopped, registers untouched: it goes on as it was
            raise

    def _interrupt(self, *, resume: bool = False) -> None:
        """Bring it to an interrupt stop (``resume``: from a stop it is held in, letting it run until then). Signals
        arriving meanwhile are held (sent again after detach); a call its filter gates that its own code makes
        meanwhile is refused."""
        ptrace(_PTRACE_INTERRUPT, self.pid)
        if resume:
            ptrace(_PTRACE_CONT, self.pid, 0, 0)
        while True:
            status = wait_stop(self.pid, self.watchdog)
            if status >> 16 == _EVENT_STOP:
                return
            if status >> 16 == _EVENT_SECCOMP:
                self._refuse_gated_call()
            elif status >> 16 == 0:  # a signal on its way in: hold it (sent again after detach)
                self.held_signals.append(os.WSTOPSIG(status))
            ptrace(_PTRACE_CONT, self.pid, 0, 0)

    def _refuse_gated_call(self) -> None:
        """At a seccomp stop the tracee's *own* code caused (not an injected call): skip the call with ``ENOSYS``, as
        the kernel answers a gated call when no tracer is there."""
        regs = self.regs()
        regs.orig_rax, regs.rax = 0xFFFFFFFFFFFFFFFF, (-38) & 0xFFFFFFFFFFFFFFFF
        self._set_regs(regs)

    def regs(self) -> Regs:
        regs = Regs()
        ptrace(_PTRACE_GETREGS, self.pid, 0, ctypes.addressof(regs))
        return regs

    def _set_regs(self, regs: Regs) -> None:
        ptrace(_PTRACE_SETREGS, self.pid, 0, ctypes.addressof(regs))

    def peek(self, address: int) -> int:
        ctypes.set_errno(0)
        value = libc.ptrace(_PTRACE_PEEKDATA, self.pid, ctypes.c_void_p(address), None)
        if value == -1 and ctypes.get_errno():
            raise OSError(ctypes.get_errno(), f"peek at {address:#x} of pid {self.pid}")
        return value & 0xFFFFFFFFFFFFFFFF

    def poke(self, address: int, data: bytes) -> None:
        data += b"\0" * (-len(data) % 8)
        for offset in range(0, len(data), 8):
            ptrace(_PTRACE_POKEDATA, self.pid, address + offset, struct.unpack("<Q", data[offset:offset + 8])[0])

    def _syscall_instruction(self) -> int:
        """Where a ``syscall`` instruction is: right before the instruction pointer when the thread was stopped in a
        system call (a blocked read), else in the C library's ``syscall()`` (the same file is mapped in every
        process of this machine's Python; found by its offset in this process's copy)."""
        here = self.stopped.rip - 2
        if signed(self.stopped.orig_rax) >= 0 and (self.peek(here) & 0xFFFF) == 0x050F:
            return here
        own = ctypes.cast(libc.syscall, ctypes.c_void_p).value
        code = ctypes.string_at(own, 128)
        offset_in_function = code.find(_SYSCALL_INSN)
        own_lib, own_base = mapping_of(os.getpid(), own)
        if offset_in_function < 0 or own_lib is None:
            raise TraceError("no syscall instruction found in this process's C library")
        executable = executable_ranges(self.pid, own_lib)
        for path, start in mappings(self.pid):
            if path == own_lib:
                address = start + (own - own_base) + offset_in_function
                if any(low <= address < high - 1 for low, high in executable) and \
                        (self.peek(address) & 0xFFFF) == 0x050F:
                    return address
        raise TraceError(f"pid {self.pid} does not map {own_lib} (the C library this process uses)")

    def call(self, name: str, *args: int) -> int:
        """Run syscall ``name`` with ``args`` in the tracee; its result (an ``OSError`` for a -errno)."""
        regs = Regs.from_buffer_copy(self.stopped)
        regs.rax, regs.orig_rax, regs.rip = NR[name], 0xFFFFFFFFFFFFFFFF, self.syscall_at
        regs.cs, regs.ss, regs.eflags = _USER_CS, _USER_SS, regs.eflags & ~_TRAP_FLAG  # 64-bit mode, no single-step
        for register, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args):
            setattr(regs, register, value & 0xFFFFFFFFFFFFFFFF)
        self._set_regs(regs)
        intended = regs
        ptrace(_PTRACE_SYSCALL, self.pid)
        syscall_stops = 0
        while True:  # syscall-entry stop, a seccomp stop if the filter gates it, a fork event, the exit stop
            status = wait_stop(self.pid, self.watchdog)
            event, sig = status >> 16, os.WSTOPSIG(status)
            if event == _EVENT_FORK:
                message = ctypes.c_ulong()
                ptrace(_PTRACE_GETEVENTMSG, self.pid, 0, ctypes.addressof(message))
                self.forked = message.value
            elif event == _EVENT_SECCOMP:
                self._check_entry(name)  # the gate: the tracer is here, so *this* call goes on
            elif sig == signal.SIGTRAP | 0x80:
                syscall_stops += 1
                if syscall_stops == 1:
                    self.at_entry = True
                    self._check_entry(name)
                    # the arguments as intended, whatever the code at the call site did to the registers
                    entry = Regs.from_buffer_copy(intended)
                    entry.orig_rax, entry.rax, entry.rip = NR[name], self.regs().rax, self.syscall_at + 2
                    self._set_regs(entry)
                else:
                    self.at_entry = False
                    result = signed(self.regs().rax)
                    if -4096 < result < 0:
                        raise OSError(-result, f"{name} in pid {self.pid}: {os.strerror(-result)}")
                    return result
            elif event == 0 and sig in _FAULTS:  # the injected instruction faulted: nothing will make it pass
                raise TraceError(f"{name} injected into pid {self.pid} faulted ({signal.Signals(sig).name})")
            elif event == 0:
                self.held_signals.append(sig)  # a signal arrived: held, sent again after detach
            ptrace(_PTRACE_SYSCALL, self.pid)

    def _check_entry(self, name: str) -> None:
        regs = self.regs()
        if regs.orig_rax != NR[name] or regs.rip != self.syscall_at + 2:
            raise TraceError(f"pid {self.pid} entered syscall {signed(regs.orig_rax)} at {regs.rip:#x}, not the "
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
            ptrace(_PTRACE_SYSCALL, self.pid)
            while True:
                status = wait_stop(self.pid, self.watchdog)
                if os.WSTOPSIG(status) == signal.SIGTRAP | 0x80:
                    break
                if status >> 16 == 0:
                    self.held_signals.append(os.WSTOPSIG(status))
                ptrace(_PTRACE_SYSCALL, self.pid)
            self.at_entry = False
        self._set_regs(Regs.from_buffer_copy(self.resume_as))
        self._interrupt(resume=True)
        for sig in dict.fromkeys(self.held_signals):  # in order, once each (standard signals do not queue)
            os.kill(self.pid, sig)
        self.held_signals.clear()
        ptrace(_PTRACE_DETACH, self.pid, 0, 0)


def ptrace_quiet(request: int, pid: int) -> None:
    try:
        ptrace(request, pid)
    except OSError:
        pass


def executable_ranges(pid: int, path: str) -> list[tuple[int, int]]:
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == path and "x" in parts[1]:
                low, high = (int(x, 16) for x in parts[0].split("-"))
                out.append((low, high))
    return out


def mappings(pid: int) -> list[tuple[str, int]]:
    """(path, start) of each file mapping of ``pid`` at file offset 0 (a library's base)."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and int(parts[2], 16) == 0:
                out.append((parts[5].strip(), int(parts[0].split("-")[0], 16)))
    return out


def mapping_of(pid: int, address: int) -> tuple[str | None, int]:
    """The file mapped at ``address`` in ``pid`` and that file's base address."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if start <= address < end and len(parts) == 6:
                path = parts[5].strip()
                return path, dict(mappings(pid)).get(path, start)
    return None, 0
