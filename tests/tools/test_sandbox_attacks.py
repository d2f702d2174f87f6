"""Hostile code against the real Python sandbox, by class of attack, several attacks per class.

1. host kernel state (sysctls, /sys, capabilities, host identity);
2. other processes (signals, pidfds, ptrace, SIGIO owners, prlimit, visibility);
3. state that survives an episode (files, xattrs, limits, IPC, lingering threads, interpreter state);
4. resources outside RLIMIT_AS (memfd and shared memory, tmpfs size and inodes, threads, kernel memory);
5. the reply channel (forged frames on every fd, from threads, output caps, broken streams, malformed calls).

Classes 1 and 2 are here, 3 and 5 in ``test_sandbox_attacks_episodes.py``, 4 in ``test_sandbox_attacks_resources.py``;
their fixtures and host checks in ``sandbox_attacks.py``. (6, the browser's egress, is in ``test_browser_tool.py``.)
Every case asserts that the attack failed — from the host where the host can see it — and that the env then serves a
correct episode; after every case the host is checked unchanged (sysctls, hostname, mounts, fds, leftover processes,
slab and RSS growth). The modules run as the user running the suite and again as uid 65534
(``test_sandbox_unprivileged.py``); assertions that depend on what the host can enforce (cgroups, a dedicated uid)
read ``PythonTool.limits`` and check that the limit in force held.
"""

from __future__ import annotations

import os
import socket
import time

# the fixtures (autouse: private_tmp, host_unchanged) are sandbox_attacks.py's
from tests.tools.sandbox_attacks import (assert_next_episode_works, env, host_unchanged, private_tmp,  # noqa: F401
                                         run, tool)


# ------------------------------------------------------------------------------- 1. host kernel state
def test_host_sysctls_procfs_and_sysfs_are_out_of_reach(env):
    code = """
import os
for path in ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/panic",
             "/proc/sysrq-trigger", "/proc/sys/kernel/hostname", "/proc/self/root/proc/sys/kernel/core_pattern",
             "/proc/1/root/proc/sys/kernel/panic", "/sys/kernel/mm/transparent_hugepage/enabled",
             "/sys/fs/cgroup/cgroup.procs", "/dev/kmsg", "/dev/mem"]:
    try:
        with open(path, "w") as f:
            f.write("|/tmp/pwn\\n" if "core" in path else "1")
        print(path, "WROTE")
    except OSError as e:
        print(path, type(e).__name__)
print("PROC", os.listdir("/proc"), "SYS", os.path.exists("/sys"))
"""
    content, call = run(env, code)
    assert call["status"] == "ok" and "WROTE" not in content, content
    assert "PROC [] SYS False" in content  # no procfs, no sysfs: nothing of the host kernel to read or write
    assert_next_episode_works(env)


def test_the_sandbox_namespaces_are_owned_by_the_sandbox_uid(env):
    """Per-user kernel counts are charged up the chain of user-namespace owners: on a root host the chain ends at the
    unprivileged sandbox uid, not at host root (an unprivileged host's sandbox is its own user anyway)."""
    import fcntl
    import struct

    from gym_llm.tools.sandbox import userns

    if os.geteuid() != 0:
        assert userns.NAMESPACE_OWNER is None  # no namespaces of the package's: bubblewrap makes its own
        return
    u1, _ = userns.root_namespaces()
    owner = struct.unpack("I", fcntl.ioctl(u1, 0xB704, b"\0" * 4))[0]  # NS_GET_OWNER_UID
    assert owner == userns.NAMESPACE_OWNER == userns.ZYGOTE_UID


def test_no_capability_and_no_way_back_to_root(env):
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Insn))]
caps = (ctypes.c_uint32 * 6)()
libc.capget(ctypes.byref(Header(0x20080522, 0)), caps)
print("CAPS", list(caps))
attempts = {
    "setuid": lambda: os.setuid(0), "setgid": lambda: os.setgid(0), "setgroups": lambda: os.setgroups([0]),
    "seteuid": lambda: os.seteuid(0), "unshare_user": lambda: libc.unshare(0x10000000),
    "unshare_mount": lambda: libc.unshare(0x00020000), "mount": lambda: libc.mount(b"t", b"/scratch", b"tmpfs", 0, None),
    "chroot": lambda: os.chroot("/scratch"), "capset": lambda: libc.capset(ctypes.byref(Header(0x20080522, 0)),
                                                                      (ctypes.c_uint32 * 6)(*([0xffffffff] * 6))),
    "pr_dumpable": lambda: libc.prctl(4, 1, 0, 0, 0), "pr_pdeathsig": lambda: libc.prctl(1, 0, 0, 0, 0),
    # a seccomp filter of its own (here: allow everything) could answer calls for it, e.g. those a trusted tracer
    # injects (gym_llm/tools/sandbox/cowfork.py)
    "pr_set_seccomp": lambda: libc.prctl(22, 2, ctypes.byref(Prog(1, ctypes.pointer(Insn(6, 0, 0, 0x7FFF0000)))),
                                         0, 0),
}
for name, attempt in attempts.items():
    try:
        result = attempt()
        print(name, "OK" if result in (None, 0) else f"refused {ctypes.get_errno()}")
    except OSError as e:
        print(name, "refused", e.errno)
"""
    content, call = run(env, code)
    assert call["status"] == "ok" and "CAPS [0, 0, 0, 0, 0, 0]" in content, content
    assert " OK" not in content, content  # every attempt was refused
    assert_next_episode_works(env)


def test_host_identity_time_and_kernel_calls_fail(env):
    hostname, clock = socket.gethostname(), time.time()
    code = """
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
class Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]
calls = {
    "sethostname": lambda: libc.sethostname(b"pwned", 5), "setdomainname": lambda: libc.setdomainname(b"pwned", 5),
    "clock_settime": lambda: libc.clock_settime(0, ctypes.byref(Timespec(0, 0))),
    "settimeofday": lambda: libc.syscall(164, ctypes.byref(Timespec(0, 0)), None),
    "reboot": lambda: libc.syscall(169, 0xfee1dead, 672274793, 0x4321fedc, None),
    "swapoff": lambda: libc.syscall(168, b"/swapfile"), "acct": lambda: libc.syscall(163, b"/scratch/acct"),
    "syslog_clear": lambda: libc.syscall(103, 5, None, 0), "init_module": lambda: libc.syscall(175, None, 0, b""),
    "bpf": lambda: libc.syscall(321, 0, None, 0), "perf_event_open": lambda: libc.syscall(298, None, 0, -1, -1, 0),
    "keyctl": lambda: libc.syscall(250, 0, 0, 0, 0, 0), "userfaultfd": lambda: libc.syscall(323, 0),
    "io_uring_setup": lambda: libc.syscall(425, 8, None), "kexec_load": lambda: libc.syscall(246, 0, 0, None, 0),
}
for name, call in calls.items():
    result = call()
    print(name, result, ctypes.get_errno())
"""
    content, call = run(env, code)
    lines = [line.split() for line in content.strip().splitlines()]
    assert call["status"] == "ok" and len(lines) == 15 and all(line[1] == "-1" for line in lines), content
    assert socket.gethostname() == hostname and abs(time.time() - clock) < 60
    assert_next_episode_works(env)


# -------------------------------------------------------------------------------- 2. other processes
def test_signals_reach_no_other_process_and_nothing_stalls_the_host(env):
    code = """
import os, signal
before = 1
delivered = []
for sig in (signal.SIGSTOP, signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV):
    for pid in [0, -1, *range(2, 300), *(-p for p in range(2, 40))]:
        try:
            os.kill(pid, sig)
            delivered.append(pid)
        except OSError:
            pass
    for pid in (1, os.getpid()):  # itself, as its namespace's init: ignored by the kernel
        os.kill(pid, sig)
print("PID", os.getpid(), "PARENT", os.getppid(), "DELIVERED", sorted(set(delivered)))
"""
    content, call = run(env, code)
    assert call["status"] == "ok" and "PID 1 PARENT 0 DELIVERED []" in content, content
    content, call = run(env, "print(before)")  # the session survived its own signals
    assert content == "1\n"
    assert_next_episode_works(env, within_s=1.0)


def test_pidfd_ptrace_and_cross_process_memory_calls_are_refused(env):
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(8)
class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
iov = Iovec(ctypes.addressof(buf), 8)
for pid in (1, 2, 3, 5):
    print("pidfd_open", pid, libc.syscall(434, pid, 0), ctypes.get_errno())
    print("pidfd_send_signal", pid, libc.syscall(424, 3, 9, None, 0), ctypes.get_errno())
    print("ptrace_attach", pid, libc.ptrace(16, pid, None, None), ctypes.get_errno())
    print("ptrace_seize", pid, libc.ptrace(0x4206, pid, None, None), ctypes.get_errno())
    print("process_vm_writev", pid, libc.syscall(311, pid, ctypes.byref(iov), 1, ctypes.byref(iov), 1, 0),
          ctypes.get_errno())
    print("kcmp", pid, libc.syscall(312, pid, 1, 0, 0, 0), ctypes.get_errno())
    print("pidfd_getfd", pid, libc.syscall(438, 3, 0, 0), ctypes.get_errno())
print("traceme", libc.ptrace(0, 0, None, None), ctypes.get_errno())
"""
    content, call = run(env, code)
    lines = [line.split() for line in content.strip().splitlines()]
    assert call["status"] == "ok" and len(lines) == 29, content
    assert all(line[-2] == "-1" for line in lines), content
    assert_next_episode_works(env)


def test_sigio_owners_reach_nothing_outside(env):
    code = """
import fcntl, os, signal
before = 1
for owner in (1, 2, 3, 7, 50, -1, -2, -3, 0):
    for sig in (signal.SIGKILL, signal.SIGSTOP, 0):
        r, w = os.pipe()
        try:
            fcntl.fcntl(r, fcntl.F_SETOWN, owner)
            fcntl.fcntl(r, fcntl.F_SETSIG, sig)
            fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
            os.write(w, b"x")
        except OSError as e:
            print(owner, sig, type(e).__name__)
print("done")
"""
    content, call = run(env, code)
    # the owners resolve inside the REPL's own pid namespace: at most itself (then it restarts), never the host's
    assert call["status"] in ("ok", "crashed") and "Traceback" not in content, content
    assert_next_episode_works(env, within_s=1.0)


def test_prlimit_reaches_only_itself(env):
    code = """
import resource
for pid in range(2, 120):
    try:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, 3))
        print(pid, "LOWERED")
    except OSError:
        pass
resource.prlimit(0, resource.RLIMIT_NOFILE, (64, 64))
print("own", resource.getrlimit(resource.RLIMIT_NOFILE))
"""
    content, call = run(env, code)
    assert call["status"] == "ok" and "LOWERED" not in content and "own (64, 64)" in content, content
    assert_next_episode_works(env)
