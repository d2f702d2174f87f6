"""Seccomp filters for the Python sandbox, compiled with ``pyseccomp`` (libseccomp) in the host process.

Two classic-BPF programs are built once per process and cached:

* the **sandbox filter** covers every process in the sandbox from its first instruction (bubblewrap loads it with
  ``--seccomp FD`` right before it starts the interpreter): a deny-list of the syscalls that reach outside a
  namespace sandbox or widen the kernel's attack surface (``ptrace`` and the other cross-process memory calls,
  ``bpf``, ``perf_event_open``, ``io_uring``, ``userfaultfd``, keyrings, module loading, ``kexec``, clock and swap
  changes, ``socket()`` for any family but ``AF_UNIX``). The zygote and the per-episode relays run under it; they
  still need ``unshare``, ``mount`` and ``setuid`` to build each REPL's namespaces, and they never run user code.
* the **REPL filter** is stacked on top in each per-episode REPL process, after its namespaces, limits and
  credentials are set and right before it reads any user code. It is an **allow-list**: a syscall not on
  :data:`REPL_ALLOW` fails with ``ENOSYS`` (so C libraries fall back as on an older kernel: ``clone3`` -> ``clone``,
  and a syscall added to Linux tomorrow is refused by default — a deny-list would let it through, as Flatpak's
  CVE-2021-41133 did with new mount syscalls). Some allowed calls are narrowed by argument: ``clone`` only with
  ``CLONE_THREAD`` (threads, never processes), ``prlimit64`` only on the process itself (``pid`` 0 or its own),
  ``kill``/``tgkill``/``tkill``/``rt_(tg)sigqueueinfo`` only to itself, ``socketpair`` only ``AF_UNIX`` (asyncio),
  ``ioctl`` never ``TIOCSTI``/``TIOCLINUX`` (typing into a terminal), ``setsockopt`` never the socket buffer sizes
  (kernel memory outside ``RLIMIT_AS``), ``prctl`` never clearing the parent-death
signal, making the process dumpable again or stacking a seccomp filter of its own (``PR_SET_SECCOMP``). Left out on purpose: every socket but
  ``socketpair`` (no network, no abstract sockets), ``fork``/``vfork``/``execve``, ``ptrace``,
  ``process_vm_*``, ``pidfd_*``, ``*xattr`` (state on files that could outlive an episode), SysV/POSIX IPC,
  ``memfd_create`` (memory outside ``RLIMIT_AS``), ``mount``/``unshare``/``setns``, ``keyctl``, ``bpf``,
  ``io_uring``, ``userfaultfd``, ``perf_event_open``, ``personality``, ``mlock`` and friends, ``set*id``, and
  ``inotify``/``fanotify`` (per-user kernel counts shared with every sandbox). ``clone`` into a new user namespace,
  ``setresuid``/``setresgid``, ``setsid``, ``capset`` and ``mount`` are answered ``SECCOMP_RET_TRACE``
  (:data:`TRACED`): ``ENOSYS`` for the REPL itself, possible only for the host's tracer while it makes a
  copy-on-write fork of the REPL (:mod:`~gym_llm.tools.sandbox.family`).

With ``allow_subprocess=True`` the REPL may ``fork``/``vfork``/``clone`` and ``execve`` (and wait for and signal its
children): each episode then gets a sandbox of its own.

The REPL's own pid is the constant 1 inside its pid namespace (``isolation="bwrap"``); without namespaces
(``isolation="none"``) the program is compiled with :data:`SELF_PID_PLACEHOLDER` and the REPL patches that
constant to its pid before loading it (:func:`patch_self_pid`).

We compile in the host and ship the BPF bytes into the sandbox, so the sandbox needs neither libseccomp nor
pyseccomp; the REPL installs its program with ``prctl(PR_SET_SECCOMP)`` via ctypes. Syscalls of a foreign ABI
(e.g. 32-bit ``int 0x80`` on x86-64) hit libseccomp's default bad-arch action: the process is killed.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import socket

__all__ = ["SELF_PID_PLACEHOLDER", "SANDBOX_DENY", "REPL_ALLOW", "sandbox_filter", "repl_filter", "patch_self_pid",
           "SeccompUnavailableError"]

logger = logging.getLogger(__name__)

SANDBOX_DENY: tuple[str, ...] = (
    # other processes' memory and identity
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "pidfd_getfd",
    # filesystems that are not namespaced
    "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "open_by_handle_at", "name_to_handle_at",
    # kernel attack surface
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "lookup_dcookie", "uselib", "nfsservctl", "_sysctl",
    # host administration
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "syslog", "acct", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "iopl", "ioperm", "quotactl", "quotactl_fd", "vhangup",
)
"""Syscalls every sandboxed process gets ``EPERM`` for (the zygote and relays too)."""

REPL_ALLOW: tuple[str, ...] = (
    # files and descriptors (all within the REPL's own mount namespace: a read-only root + its tmpfs)
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2",
    "open", "openat", "openat2", "creat", "close", "close_range", "lseek", "dup", "dup2", "dup3", "fcntl", "flock",
    "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2",
    "getdents64", "getcwd", "chdir", "fchdir", "rename", "renameat", "renameat2", "mkdir", "mkdirat", "rmdir",
    "unlink", "unlinkat", "link", "linkat", "symlink", "symlinkat", "readlink", "readlinkat", "chmod", "fchmod",
    "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "umask", "truncate", "ftruncate",
    "mknod", "mknodat",  # FIFOs and socket files; device nodes need CAP_MKNOD, which no sandbox process has
    "fallocate", "fsync", "fdatasync", "sync_file_range", "utime", "utimes", "utimensat", "futimesat",
    "sendfile", "copy_file_range", "splice", "tee", "readahead", "fadvise64", "pipe", "pipe2",
    "ioctl",
    # waiting and events
    "select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "timerfd_create", "timerfd_settime", "timerfd_gettime",
    "signalfd", "signalfd4", "futex", "futex_waitv", "set_robust_list", "get_robust_list", "nanosleep",
    "clock_nanosleep", "sched_yield", "pause",
    # memory (bounded by RLIMIT_AS and the memory cgroup)
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync", "membarrier", "mbind",
    "get_mempolicy", "set_mempolicy",
    # threads (clone: CLONE_THREAD only, see repl_filter) and the process itself
    "clone", "set_tid_address", "rseq", "arch_prctl", "prctl", "exit", "exit_group", "wait4", "waitid",
    "getpid", "gettid", "getppid", "getpgrp", "getpgid", "getsid", "getuid", "geteuid", "getgid", "getegid",
    "getresuid", "getresgid", "getgroups", "capget", "getrlimit", "setrlimit", "prlimit64", "getrusage", "times",
    "getpriority", "setpriority", "sched_getaffinity", "sched_getparam", "sched_getscheduler",
    "sched_get_priority_max", "sched_get_priority_min", "getcpu", "sysinfo", "uname",
    # signals (to itself; see repl_filter)
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigsuspend", "rt_sigpending", "rt_sigtimedwait",
    "sigaltstack", "kill", "tgkill", "tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
    # time and randomness
    "clock_gettime", "clock_getres", "gettimeofday", "time", "getrandom",
    # AF_UNIX socket pairs (asyncio's self-pipe) and I/O on them; socket() itself is not allowed
    "socketpair", "sendmsg", "recvmsg", "sendto", "recvfrom", "sendmmsg", "recvmmsg", "shutdown", "getsockopt",
    "setsockopt", "getsockname", "getpeername",
)
"""Syscalls the REPL may make (narrowed by argument for some: see :func:`repl_filter`); all others fail with
``ENOSYS``."""

REPL_REFUSED: tuple[str, ...] = (
    "socket", "memfd_create", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_send_signal",
    "pidfd_getfd", "mount", "umount2", "unshare", "setns", "chroot", "pivot_root", "sethostname", "setdomainname",
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "setfsuid", "setfsgid",
    "capset", "setxattr", "lsetxattr", "fsetxattr", "getxattr", "lgetxattr", "fgetxattr", "listxattr",
    "llistxattr", "flistxattr", "removexattr", "lremovexattr", "fremovexattr", "shmget", "shmat", "semget",
    "msgget", "mq_open", "keyctl", "add_key", "request_key", "personality", "mlock", "mlock2", "mlockall",
    "sched_setaffinity", "sched_setscheduler", "sched_setparam", "ioprio_set", "bpf", "perf_event_open",
    # per-user kernel counts (inotify instances and watches are charged to the namespace owner's uid on the host)
    "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_init", "fanotify_mark",
    "userfaultfd", "io_uring_setup", "kexec_load", "init_module", "finit_module", "reboot", "swapon", "acct",
)
"""Not allowed either, but refused with ``EPERM`` (a ``PermissionError`` in Python) instead of ``ENOSYS``: the
calls user code is likely to try on purpose, where "not permitted" is the honest answer."""

TRACED: tuple[str, ...] = ("setresuid", "setresgid", "setsid", "capset", "mount")
"""Answered ``SECCOMP_RET_TRACE`` (with ``clone`` into a new user namespace) unless ``allow_subprocess``: the calls
that set up a copy-on-write fork of the REPL (:mod:`~gym_llm.tools.sandbox.cowfork`). With no tracer attached —
always, except while the host's tracer injects them into the stopped REPL or its new copy — the kernel fails them
with ``ENOSYS``: the REPL itself can never make them."""

REPL_PROCESS: tuple[str, ...] = ("fork", "vfork", "execve", "execveat")
"""Refused with ``EPERM`` unless ``allow_subprocess``."""

REPL_SUBPROCESS: tuple[str, ...] = ("fork", "vfork", "execve", "execveat", "clone3")
"""Added to :data:`REPL_ALLOW` with ``allow_subprocess=True``."""

SIGNAL_SELF_ONLY: tuple[str, ...] = ("kill", "tgkill", "tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
"""Syscalls whose first argument (a pid or tid) must be the REPL's own pid. A thread's tid differs from the pid,
so ``tkill`` to a sibling thread is refused; Python signals threads only through ``pthread_kill`` (``tgkill``, whose
first argument is the process's pid)."""

SELF_ONLY: tuple[str, ...] = ("getpgid", "getsid", "getpriority", "setpriority", "sched_getaffinity",
                              "sched_getparam", "sched_getscheduler", "get_robust_list")
"""Allowed on the REPL itself only (pid 0 or its own; ``ENOSYS`` for any other): they name a process, and a REPL's
copy-on-write forks are processes of its uid, in its pid namespace."""

SELF_PID_PLACEHOLDER = 0x3EADBEEF
"""Stands for the REPL's pid in the compiled REPL filter (above any real pid: pid_max <= 2**22); the
REPL replaces the ``k`` field of every BPF instruction that holds it."""

_CLONE_THREAD = 0x00010000
_CLONE_NEWUSER = 0x10000000
_SOCKET_BUFFER_OPTIONS = (7, 8, 32, 33)  # SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE
_TIOCSTI = 0x5412  # push characters into a terminal's input queue
_TIOCLINUX = 0x541C
_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG, _PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 1, 2, 3, 4
_PR_SET_SECCOMP = 22


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


def _known(sc, name: str) -> bool:
    try:
        sc.resolve_syscall(sc.system_arch(), name)
        return True
    except Exception:  # not a syscall on this architecture (e.g. open on arm64, _sysctl on newer tables)
        return False


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


@functools.lru_cache(maxsize=None)
def sandbox_filter() -> bytes:
    """The BPF program for every process in the sandbox (see the module docstring)."""
    sc = _pyseccomp()
    program = sc.SyscallFilter(sc.ALLOW)
    for name in SANDBOX_DENY:
        if _known(sc, name):
            program.add_rule(sc.ERRNO(errno.EPERM), name)
    program.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
    program.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.EQ, _TIOCSTI))
    return _export(program)


@functools.lru_cache(maxsize=None)
def repl_filter(allow_subprocess: bool = False, self_pid: int = SELF_PID_PLACEHOLDER) -> bytes:
    """The allow-list each REPL stacks on before running user code (see the module docstring).

    Args:
        allow_subprocess: also allow ``fork``/``vfork``/``clone``/``execve`` and signals to any process.
        self_pid: the REPL's pid as it sees it (1 in its own pid namespace), or :data:`SELF_PID_PLACEHOLDER` to be
            patched in by the REPL (:func:`patch_self_pid`).
    """
    sc = _pyseccomp()
    program = sc.SyscallFilter(sc.ERRNO(errno.ENOSYS))
    narrowed = {"clone", "prlimit64", "socketpair", "ioctl", "prctl", "setsockopt", *SIGNAL_SELF_ONLY, *SELF_ONLY}
    allowed = [*REPL_ALLOW, *(REPL_SUBPROCESS if allow_subprocess else ())]
    for name in allowed:
        if _known(sc, name) and (name not in narrowed or allow_subprocess and name in ("clone", *SIGNAL_SELF_ONLY,
                                                                                       *SELF_ONLY)):
            program.add_rule(sc.ALLOW, name)
    if not allow_subprocess:  # calls that name another process: only itself (0 or its own pid); copies of the REPL
        for name in SELF_ONLY:  # (forks) are its children and of its uid
            if name in ("getpriority", "setpriority"):  # (which, who): PRIO_PROCESS only (PRIO_USER: every process
                for who in {0, self_pid}:               # of its uid)
                    program.add_rule(sc.ALLOW, name, sc.Arg(0, sc.EQ, 0), sc.Arg(1, sc.EQ, who))
            elif _known(sc, name):
                for pid in {0, self_pid}:
                    program.add_rule(sc.ALLOW, name, sc.Arg(0, sc.EQ, pid))
    if not allow_subprocess:
        program.add_rule(sc.ALLOW, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, _CLONE_THREAD))
        program.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD | _CLONE_NEWUSER, 0))
        # a process in a new user namespace: only a copy-on-write fork the host's tracer makes (see TRACED)
        program.add_rule(sc.TRACE(0), "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD | _CLONE_NEWUSER, _CLONE_NEWUSER))
        for name in TRACED:
            if _known(sc, name):
                program.add_rule(sc.TRACE(0), name)
        for name in SIGNAL_SELF_ONLY:
            if _known(sc, name):
                program.add_rule(sc.ALLOW, name, sc.Arg(0, sc.EQ, self_pid))
                program.add_rule(sc.ERRNO(errno.EPERM), name, sc.Arg(0, sc.NE, self_pid))
    # a rule compares each argument once, so "not one of these" is spelled as ranges and points around them
    program.add_rule(sc.ALLOW, "prlimit64", sc.Arg(0, sc.EQ, 0))
    if self_pid != 0:
        program.add_rule(sc.ALLOW, "prlimit64", sc.Arg(0, sc.EQ, self_pid))
    program.add_rule(sc.ALLOW, "socketpair", sc.Arg(0, sc.EQ, socket.AF_UNIX))
    program.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socketpair", sc.Arg(0, sc.NE, socket.AF_UNIX))
    # setsockopt, except socket buffer sizes: kernel memory outside RLIMIT_AS (a memory cgroup would count it, but
    # hosts without one would let 125 socket pairs hold 2 GiB)
    program.add_rule(sc.ALLOW, "setsockopt", sc.Arg(1, sc.NE, socket.SOL_SOCKET))
    first, last = min(_SOCKET_BUFFER_OPTIONS), max(_SOCKET_BUFFER_OPTIONS)
    program.add_rule(sc.ALLOW, "setsockopt", sc.Arg(1, sc.EQ, socket.SOL_SOCKET), sc.Arg(2, sc.LT, first))
    program.add_rule(sc.ALLOW, "setsockopt", sc.Arg(1, sc.EQ, socket.SOL_SOCKET), sc.Arg(2, sc.GT, last))
    for option in range(first, last + 1):  # one comparison per argument and rule: the gap between, point by point
        action = sc.ERRNO(errno.EPERM) if option in _SOCKET_BUFFER_OPTIONS else sc.ALLOW
        program.add_rule(action, "setsockopt", sc.Arg(1, sc.EQ, socket.SOL_SOCKET), sc.Arg(2, sc.EQ, option))
    program.add_rule(sc.ALLOW, "ioctl", sc.Arg(1, sc.LT, _TIOCSTI))
    program.add_rule(sc.ALLOW, "ioctl", sc.Arg(1, sc.GT, _TIOCLINUX))
    for request in range(_TIOCSTI + 1, _TIOCLINUX):  # TIOCGWINSZ ... FIONREAD
        program.add_rule(sc.ALLOW, "ioctl", sc.Arg(1, sc.EQ, request))
    for request in (_TIOCSTI, _TIOCLINUX):
        program.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.EQ, request))
    # prctl, except clearing the parent-death signal, making the process dumpable again, or stacking a seccomp filter
    # of its own (one could answer, for the process, the calls a trusted tracer injects: see cowfork.py)
    program.add_rule(sc.ALLOW, "prctl", sc.Arg(0, sc.GT, _PR_SET_SECCOMP))
    for option in (_PR_GET_PDEATHSIG, _PR_GET_DUMPABLE, *range(_PR_SET_DUMPABLE + 1, _PR_SET_SECCOMP)):
        program.add_rule(sc.ALLOW, "prctl", sc.Arg(0, sc.EQ, option))
    for option in (_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_SECCOMP):
        program.add_rule(sc.ERRNO(errno.EPERM), "prctl", sc.Arg(0, sc.EQ, option))
    for name in (*REPL_REFUSED, *(() if allow_subprocess else REPL_PROCESS)):
        if _known(sc, name) and (allow_subprocess or name not in TRACED):
            program.add_rule(sc.ERRNO(errno.EPERM), name)
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
