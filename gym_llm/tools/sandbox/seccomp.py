"""Seccomp filters for the Python sandbox, compiled with ``pyseccomp`` (libseccomp) in the host process.

Two classic-BPF programs are built once per process and cached:

* the **sandbox filter** covers every process in the sandbox from its first instruction (bubblewrap
  loads it with ``--seccomp FD`` right before it starts the interpreter). It denies the syscalls that
  reach outside a namespace sandbox or widen the kernel's attack surface: ``ptrace`` and the other
  cross-process memory calls, mounts and namespace changes, ``bpf``, ``perf_event_open``,
  ``io_uring``, ``userfaultfd``, keyrings, module loading, ``kexec``, clock and swap changes, and
  ``socket()`` for any family but ``AF_UNIX``.
* the **REPL filter** is stacked on top, inside each per-episode REPL process, after its limits are
  set and before it reads any user code. It adds: no new processes (``fork``/``vfork``, ``clone``
  without ``CLONE_THREAD``; ``clone3`` answers ``ENOSYS`` so libc falls back to ``clone``, where the
  flags can be checked), no ``execve``, no sockets at all, and no SysV/POSIX IPC objects (which could
  outlive the episode), and no signals to any process but itself (``kill``, ``tgkill``,
  ``rt_sigqueueinfo``, ``rt_tgsigqueueinfo`` and ``pidfd_open`` must target its own pid; ``tkill`` is
  denied): it cannot kill the zygote that forks the next episode's REPL, nor — in the unsandboxed
  mode — any host process. The REPL's own pid is known only after ``fork``, so the program is
  compiled with :data:`SELF_PID_PLACEHOLDER` and the REPL patches that constant to its pid before
  loading it. With ``allow_subprocess=True`` the process and signal rules are left out.

Denied calls fail with an errno (``EPERM`` unless noted) rather than killing the process, so user code
sees a normal ``PermissionError``. Syscalls of a foreign ABI (e.g. 32-bit ``int 0x80`` on x86-64) hit
libseccomp's default bad-arch action: the process is killed.

We compile in the host and ship the BPF bytes into the sandbox, so the sandbox needs neither
libseccomp nor pyseccomp; the REPL installs its program with ``prctl(PR_SET_SECCOMP)`` via ctypes.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import socket

__all__ = ["SELF_PID_PLACEHOLDER", "SANDBOX_DENY", "REPL_DENY_PROCESS", "REPL_DENY_IPC", "sandbox_filter", "repl_filter", "SeccompUnavailableError"]

logger = logging.getLogger(__name__)

SANDBOX_DENY: tuple[str, ...] = (
    # other processes' memory and identity
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "pidfd_getfd",
    # filesystems and namespaces
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "open_by_handle_at",
    "name_to_handle_at", "mknod", "mknodat",
    # kernel attack surface
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "lookup_dcookie", "uselib", "nfsservctl", "_sysctl",
    # host administration
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "syslog", "acct", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "iopl", "ioperm", "quotactl", "quotactl_fd", "vhangup",
)
"""Syscalls every sandboxed process gets ``EPERM`` for."""

REPL_DENY_PROCESS: tuple[str, ...] = ("fork", "vfork", "execve", "execveat")
"""No child processes and no exec in the REPL (``clone`` is checked by flags, ``clone3`` gets ENOSYS)."""

REPL_DENY_IPC: tuple[str, ...] = ("socket", "shmget", "semget", "msgget", "mq_open")
"""No sockets (``socketpair`` stays: asyncio needs it) and no IPC objects that outlive a process."""

SIGNAL_SELF_ONLY: tuple[str, ...] = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open")
"""Syscalls whose first argument (a pid) must be the REPL's own."""

SELF_PID_PLACEHOLDER = 0x3EADBEEF
"""Stands for the REPL's pid in the compiled REPL filter (above any real pid: pid_max <= 2**22); the
REPL replaces the ``k`` field of every BPF instruction that holds it."""

_CLONE_THREAD = 0x00010000
_TIOCSTI = 0x5412  # push characters into a terminal's input queue


class SeccompUnavailableError(RuntimeError):
    """pyseccomp or the libseccomp shared library is missing."""


def _pyseccomp():
    try:
        import pyseccomp
    except (ImportError, RuntimeError) as e:  # pyseccomp raises RuntimeError when libseccomp is missing
        raise SeccompUnavailableError(
            f"The Python sandbox compiles its seccomp filter with pyseccomp over libseccomp, which failed: {e}. "
            "Install both: `apt-get install libseccomp2` (Debian/Ubuntu; `dnf install libseccomp` on Fedora) and "
            "`pip install 'gym-llm[tools]'` (pyseccomp)."
        ) from e
    return pyseccomp


def _deny(sc, program, names: tuple[str, ...], err: int = errno.EPERM) -> None:
    arch = sc.system_arch()
    for name in names:
        try:
            sc.resolve_syscall(arch, name)
        except Exception:  # unknown on this architecture (e.g. _sysctl on newer kernels' tables)
            continue
        program.add_rule(sc.ERRNO(err), name)


def _export(program) -> bytes:
    read_fd, write_fd = os.pipe()
    try:
        with os.fdopen(write_fd, "wb", closefd=True) as sink:
            program.export_bpf(sink)
        chunks = []
        while chunk := os.read(read_fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(read_fd)
    data = b"".join(chunks)
    assert data and len(data) % 8 == 0, "a BPF program is a whole number of 8-byte instructions"
    return data


def _base_rules(sc, program) -> None:
    _deny(sc, program, SANDBOX_DENY)
    program.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
    program.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.EQ, _TIOCSTI))


@functools.lru_cache(maxsize=None)
def sandbox_filter() -> bytes:
    """The BPF program for every process in the sandbox (see the module docstring)."""
    sc = _pyseccomp()
    program = sc.SyscallFilter(sc.ALLOW)
    _base_rules(sc, program)
    return _export(program)


@functools.lru_cache(maxsize=None)
def repl_filter(allow_subprocess: bool = False) -> bytes:
    """The BPF program each REPL stacks on before running user code (it repeats the sandbox rules, so
    the unsandboxed mode gets them too)."""
    sc = _pyseccomp()
    program = sc.SyscallFilter(sc.ALLOW)
    _deny(sc, program, SANDBOX_DENY)
    _deny(sc, program, REPL_DENY_IPC)
    program.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.EQ, _TIOCSTI))
    if not allow_subprocess:
        _deny(sc, program, REPL_DENY_PROCESS)
        program.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
        _deny(sc, program, ("clone3",), errno.ENOSYS)
        _deny(sc, program, ("tkill",))
        for name in SIGNAL_SELF_ONLY:
            program.add_rule(sc.ERRNO(errno.EPERM), name, sc.Arg(0, sc.NE, SELF_PID_PLACEHOLDER))
    return _export(program)


def patch_self_pid(program: bytes, pid: int) -> bytes:
    """``program`` with :data:`SELF_PID_PLACEHOLDER` replaced by ``pid`` (what the REPL does in the
    sandbox, written here too so it is tested on the host). Instructions are 8 bytes:
    ``u16 code, u8 jt, u8 jf, u32 k`` in native byte order."""
    import sys

    out = bytearray(program)
    for offset in range(0, len(out), 8):
        if int.from_bytes(out[offset + 4: offset + 8], sys.byteorder) == SELF_PID_PLACEHOLDER:
            out[offset + 4: offset + 8] = pid.to_bytes(4, sys.byteorder)
    return bytes(out)
