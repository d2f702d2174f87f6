"""Hostile code against the real Python sandbox, by class of attack, several attacks per class.

1. host kernel state (sysctls, /sys, capabilities, host identity);
2. other processes (signals, pidfds, ptrace, SIGIO owners, prlimit, visibility);
3. state that survives an episode (files, xattrs, limits, IPC, lingering threads, interpreter state);
4. resources outside RLIMIT_AS (memfd and shared memory, tmpfs size and inodes, threads, kernel memory);
5. the reply channel (forged frames on every fd, from threads, output caps, broken streams, malformed calls).

(6, the browser's egress, is in ``test_browser_tool.py``.) Every case asserts that the attack failed — from the host
where the host can see it — and that the env then serves a correct episode; after every case the host is checked
unchanged (sysctls, hostname, mounts, fds, leftover processes, slab and RSS growth). The module runs as the user
running the suite and again as uid 65534 (``test_sandbox_unprivileged.py``); assertions that depend on what the
host can enforce (cgroups, a dedicated uid) read ``PythonTool.limits`` and check that the limit in force held.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path

import pytest

from gym_llm.envs.python_tool import LLMPythonToolEnv
from gym_llm.tools import PythonTool
from gym_llm.tools.base import ToolCall
from gym_llm.tools.sandbox.process import cgroup_support

# No attack here is meant to reach the wall clock: it is roomy, so a loaded machine cannot turn an answer into a timeout
TIMEOUT_S = 10.0
MEMORY_MB = 256
MAX_THREADS = 32
SCRATCH_MB = 8
MAX_FILES = 512
TASKS = [{"question": "What is 6 times 7?", "answer": "6 * 7 = 42\n#### 42"}]
LIMITS = dict(timeout_s=TIMEOUT_S, memory_limit_mb=MEMORY_MB, cpu_limit_s=30, max_output_chars=2000,
              max_error_chars=1500, max_threads=MAX_THREADS, scratch_size_mb=SCRATCH_MB, max_files=MAX_FILES,
              file_size_limit_mb=32)
SYSCTLS = ["kernel/core_pattern", "kernel/panic", "kernel/hostname", "kernel/sysrq", "kernel/ctrl-alt-del",
           "vm/overcommit_memory", "vm/swappiness", "kernel/randomize_va_space"]


# ------------------------------------------------------------------------------------------- fixtures
SYSTEM_TMP = Path(tempfile.gettempdir())


@pytest.fixture(scope="module", autouse=True)
def private_tmp(tmp_path_factory):
    """This module's host-side temp files (the scratch dirs of unsandboxed tools) go to a folder of its own, so
    :func:`host_state` sees what *these* sandboxes leave, not what another test process's tools hold meanwhile."""
    saved = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("host_tmp"))
    yield Path(tempfile.tempdir)
    tempfile.tempdir = saved


def _sandbox_cgroups() -> set[Path]:
    return {p.resolve() for p in Path("/sys/fs/cgroup").rglob(f"gym-llm-{os.getpid()}/sandbox-*")}


OTHER_CGROUPS: set[Path] = set()  # sandboxes of other tools this worker process keeps (pooled envs of earlier tests)


@pytest.fixture(scope="module")
def tool(private_tmp):
    others = _sandbox_cgroups()
    OTHER_CGROUPS.clear()
    OTHER_CGROUPS.update(others)
    tool = PythonTool(min_idle=1, **LIMITS)
    tool.attach()
    LIVE_TOOLS.append(tool)
    session = tool.open_session()  # warm up: the host's once-per-process state (user namespaces, cgroup dirs)
    assert session.run(ToolCall(tool.name, {"code": "print(1)"})).content == "1\n"
    session.close()
    yield tool
    tool.detach()
    # every sandbox cgroup this tool made is gone with its sandboxes
    cgroup_dirs = _sandbox_cgroups() - others if tool.limits["memory"].count("cgroup v") else set()
    assert not cgroup_dirs, cgroup_dirs


def _env(tool):
    env = LLMPythonToolEnv(tasks=TASKS, python_tool=tool, max_turns=40, max_observation_chars=1 << 20)
    env.reset(seed=0)
    env.test_tool = tool  # for assert_next_episode_works
    return env


@pytest.fixture
def env(tool):
    env = _env(tool)
    yield env
    env.close()


# Class 4 runs once more with cgroups="off" where this host has cgroups (root here): the (cgroups: none) column of
# the tested matrix for a root host, where RLIMIT_NPROC on each REPL's own uid and the tmpfs caps are what hold.
CGROUP_MODES = ["auto"] + (["off"] if cgroup_support().version is not None else [])


@pytest.fixture(scope="module", params=CGROUP_MODES)
def resource_tool(request, tool):
    if request.param == "auto":
        yield tool
        return
    other = PythonTool(min_idle=1, cgroups="off", **LIMITS)
    other.attach()
    session = other.open_session()  # its once-per-tool state exists before the first attack measures the host
    assert session.run(ToolCall(other.name, {"code": "print(1)"})).content == "1\n"
    session.close()
    LIVE_TOOLS.append(other)
    assert "cgroup" not in other.limits["memory"].replace("cgroups='off'", ""), other.limits
    yield other
    LIVE_TOOLS.remove(other)
    other.detach()


@pytest.fixture
def resource_env(resource_tool):
    env = _env(resource_tool)
    yield env
    env.close()


def run(env, code: str) -> tuple[str, dict]:
    """Step with one python block; return the tool message text and the call's info."""
    before = len(env.unwrapped.episode.messages)
    _, reward, terminated, truncated, info = env.step(f"Let me try.\n```python\n{code}\n```")
    assert (reward, terminated, truncated) == (0.0, False, False)
    [call] = json.loads(info["tool_calls"])
    [message] = env.unwrapped.episode.messages[before + 1:]
    assert message.role == "tool"
    return message.content, call


def _reset_and_run(env) -> float:
    """Seconds to start a new episode and run one small block in it (checked to work), once the tool's pool has its
    spare sandbox started: what is timed is ending the old episode (its sandbox killed, its cgroup removed), taking
    the spare and running the block — not a sandbox start, which a loaded machine can take seconds for."""
    env.test_tool.pool.settled(timeout_s=60.0)
    start = time.perf_counter()
    env.reset(seed=1)
    content, call = run(env, "marker = 6 * 7\nprint(marker)")
    assert call["status"] == "ok" and content.strip() == "42"
    return time.perf_counter() - start


def assert_next_episode_works(env, *, within_s: float = 2.0) -> None:
    """A new episode starts promptly (nothing the code did stalls the host) and runs code and scoring normally.

    "Promptly": at most ``within_s`` beyond what a clean new episode takes on this machine now (:func:`_reset_and_run`
    times both alike). Each episode gets a fresh REPL, started in the background while the episode before it runs;
    after a short episode on a loaded machine the next one waits for it (seen: 2.4-2.6 s against 0.02 s when it was
    ready). So when the first is slow, clean episodes are timed right after short ones (the same wait, nothing the
    code did) and only the excess over the slowest counts: a stall the code left behind (a wait on a process, pipe or
    cgroup) shows up in it, machine load does not."""
    elapsed = _reset_and_run(env)
    if elapsed >= within_s:
        clean = max(_reset_and_run(env) for _ in range(3))
        assert elapsed - clean < within_s, f"{elapsed:.2f} s after the code, {clean:.2f} s for a clean episode"
    _, reward, terminated, _, info = env.step("The answer is\n#### 42")
    assert terminated and reward == 1.0 and info["correct"]


# ------------------------------------------------------------------------------------ the host, unchanged
def _meminfo_kb(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _descendants(pid: int, tree: dict[int, list[int]]) -> int:
    return sum(1 + _descendants(child, tree) for child in tree.get(pid, []))


LIVE_TOOLS: list = []  # every tool this module made (the fd count allows for their live sandboxes)


def _orphans() -> list[str]:
    """Processes nobody waits for that the sandbox machinery could have left: user-namespace helpers, and anything
    running as a sandbox uid whose parent is init."""
    from gym_llm.tools.sandbox.userns import ZYGOTE_UID

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uid, ppid = int(fields["Uid"].split()[1]), int(fields["PPid"])
        if fields["State"].split()[0] in ("Z", "X") or not cmdline:  # dead, or being torn down right now
            continue
        if b"CLONE_NEWUSER = 0x10000000" in cmdline or (uid >= ZYGOTE_UID and ppid == 1):
            found.append(f"{entry} uid={uid} {cmdline[:60]!r}")
    return found


def _cgroup_dirs() -> int:
    """Sandbox cgroup directories of this process (one per live sandbox and controller; none once they are gone),
    not counting those of other tools this worker process kept from earlier tests (pooled envs: OTHER_CGROUPS)."""
    dirs = {child for root in Path("/sys/fs/cgroup").glob(f"*/gym-llm-{os.getpid()}") for child in root.iterdir()
            if child.is_dir()} | set(Path("/sys/fs/cgroup").glob(f"gym-llm-{os.getpid()}/*/"))
    return len({d for d in dirs if d.resolve() not in OTHER_CGROUPS})


def host_state(tool) -> dict:
    # each live sandbox holds two host fds: its control socket and stderr pipe
    sandboxes = sum(live.pool.settled() for live in LIVE_TOOLS)
    # host-side scratch dirs (this module's own temp dir), and anything a sandbox's uid wrote into the system's
    tmp = {p.name for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith("gym_llm_scratch_")} | \
        {p.name for p in SYSTEM_TMP.iterdir() if _owner(p) >= 1_900_000_000}
    return {"sysctls": {name: Path("/proc/sys", name).read_text() for name in SYSCTLS
                        if Path("/proc/sys", name).exists()},
            "mounts": Path("/proc/self/mountinfo").read_text().count("\n"),
            "fds_per_sandbox": len(os.listdir("/proc/self/fd")) - 2 * sandboxes,
            "cgroup_dirs": _cgroup_dirs(), "sandboxes": sandboxes,
            "orphans": _orphans(), "tmp": tmp,
            "slab_kb": _meminfo_kb("Slab"), "rss_kb": int(Path("/proc/self/statm").read_text().split()[1]) * 4}


def _owner(path: Path) -> int:
    try:
        return path.lstat().st_uid
    except OSError:
        return -1


@pytest.fixture(autouse=True)
def host_unchanged(request, tool):
    """After each attack (its episode ended): host sysctls and mounts as before, no fd, process or memory left."""
    before = host_state(tool)
    yield
    time.sleep(0.05)
    after = host_state(tool)
    assert after["sysctls"] == before["sysctls"], "a host sysctl changed"
    assert after["mounts"] == before["mounts"], "the host's mount table changed"
    assert after["fds_per_sandbox"] == before["fds_per_sandbox"], ("the host leaked file descriptors", before, after)
    if after["orphans"]:  # a sandbox killed a moment ago may still be on its way out
        time.sleep(1.0)
        after["orphans"] = _orphans()
    assert after["orphans"] == [], ("processes left behind", after["orphans"])
    assert after["tmp"] <= before["tmp"], ("files left in the host's temp dir", after["tmp"] - before["tmp"])
    # at most one directory per live sandbox and controller (memory, pids)
    assert after["cgroup_dirs"] <= 2 * after["sandboxes"], ("cgroups left behind", after)
    assert after["slab_kb"] - before["slab_kb"] < 48 << 10, "kernel slab grew by more than 48 MiB"
    assert after["rss_kb"] - before["rss_kb"] < 64 << 10, "the host process grew by more than 64 MiB"
    # bwrap, its init, the zygote, the spare relay and REPL; nothing else. An episode's relay and REPL are killed when
    # it ends and reaped a moment later: on a loaded machine (seen once, in the unprivileged run beside the whole
    # suite) they were still there 50 ms after; a process that outlives its episode is there after 2 s too.
    deadline = time.monotonic() + 2.0
    while True:
        tree = _children()
        counts = [_descendants(sandbox.process.pid, tree) for sandbox in list(tool.pool._idle)]
        if all(count <= 4 for count in counts) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert all(count <= 4 for count in counts), ("a process outlived its episode", counts)


def thread_cap_in_force(tool) -> bool:
    return not tool.limits["threads"].startswith("not capped")


def memory_cgroup_in_force(tool) -> bool:
    return "cgroup v" in tool.limits["memory"]


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


# ------------------------------------------------------------------------- 3. nothing survives an episode
@pytest.fixture
def one_sandbox():
    """A tool whose pool keeps exactly one sandbox: consecutive episodes run in the same sandbox."""
    tool = PythonTool(min_idle=0, **LIMITS)
    tool.attach()
    yield tool
    tool.detach()


def two_episodes(tool, first: str, second: str) -> tuple[str, str]:
    """Run ``first`` in one episode and ``second`` in the next, checking both ran in the same sandbox."""
    sandboxes, outputs = [], []
    for code in (first, second):
        session = tool.open_session()
        try:
            outputs.append(session.run(ToolCall(tool.name, {"code": code})).content)
            sandboxes.append(session._sandbox)
        finally:
            session.close()
    assert sandboxes[0] is sandboxes[1] and sandboxes[0].alive  # the same zygote served both
    return outputs[0], outputs[1]


def test_files_modes_and_xattrs_do_not_survive(one_sandbox):
    first = """
import os
for path in ("/scratch/a", "/tmp/b", os.path.expanduser("~/c"), "d/e/f"):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "w").write("left behind")
os.chmod("/scratch", 0o777)
os.mkfifo("/scratch/fifo")
for target in ("/scratch", "/scratch/a"):
    try:
        os.setxattr(target, "user.marker", b"x")
        print("XATTR SET")
    except OSError as e:
        print("xattr", type(e).__name__)
print(sorted(os.listdir("/scratch")))
"""
    second = "import os\nprint(os.listdir('/scratch'), oct(os.stat('/scratch').st_mode & 0o777))\n" \
             "try:\n    print(os.listxattr('/scratch'))\nexcept OSError as e:\n    print('xattr', type(e).__name__)"
    out1, out2 = two_episodes(one_sandbox, first, second)
    assert "XATTR SET" not in out1 and "'a'" in out1, out1
    assert out2.startswith("[] 0o700\n") and "marker" not in out2, out2


def test_limits_nice_umask_and_environment_do_not_survive(one_sandbox):
    first = """
import os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
resource.setrlimit(resource.RLIMIT_AS, (64 << 20, 64 << 20))
resource.setrlimit(resource.RLIMIT_CPU, (1, 1))
os.nice(19)
os.umask(0o777)
os.environ["LEFT"] = "behind"
print("lowered")
"""
    second = "import os, resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource." \
             "RLIMIT_AS)[0] >> 20, os.nice(0), oct(os.umask(0o022)), 'LEFT' in os.environ)"
    out1, out2 = two_episodes(one_sandbox, first, second)
    assert out1 == "lowered\n"
    # the next episode is back at the host's own niceness (0 unless the suite itself runs under `nice`)
    assert out2 == f"(256, 256) {MEMORY_MB} {os.nice(0)} 0o22 False\n", out2


def test_ipc_objects_and_shared_memory_cannot_be_left(one_sandbox):
    first = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("shmget", libc.shmget(0x1234, 4096, 0o1666), ctypes.get_errno())
print("semget", libc.semget(0x1234, 1, 0o1666), ctypes.get_errno())
print("msgget", libc.msgget(0x1234, 0o1666), ctypes.get_errno())
for attempt in ("mq", "posix_shm", "dev_shm"):
    try:
        if attempt == "mq":
            raise OSError(libc.mq_open(b"/q", 0o100 | 2, 0o666, None) and ctypes.get_errno())
        elif attempt == "posix_shm":
            from multiprocessing import shared_memory
            shared_memory.SharedMemory(name="left", create=True, size=4096)
            print(attempt, "CREATED")
        else:
            open("/dev/shm/left", "w").write("x")
            print(attempt, "CREATED")
    except Exception as e:
        print(attempt, type(e).__name__)
"""
    second = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n" \
             "print(libc.shmget(0x1234, 0, 0), os.path.exists('/dev/shm/left'))"
    out1, out2 = two_episodes(one_sandbox, first, second)
    assert "CREATED" not in out1 and out1.count(" -1 ") == 3, out1
    assert out2 == "-1 False\n", out2


def test_a_thread_left_running_dies_with_its_episode(one_sandbox):
    first = """
import os, threading, time
def haunt():
    n = 0
    while True:
        n += 1
        try:
            open(f"/scratch/ghost{n}", "w").write("boo")
        except OSError:
            pass
        time.sleep(0.01)
for _ in range(4):
    threading.Thread(target=haunt, daemon=False).start()
time.sleep(0.1)
print(len(os.listdir("/scratch")) > 0)
"""
    second = "import os, time\nfirst = os.listdir('/scratch')\ntime.sleep(0.3)\nprint(first, os.listdir('/scratch'))"
    out1, out2 = two_episodes(one_sandbox, first, second)
    assert out1 == "True\n" and out2 == "[] []\n", (out1, out2)


def test_interpreter_state_does_not_survive(one_sandbox):
    first = """
import builtins, sys
builtins.print = lambda *a, **k: None
sys.modules["json"] = None
sys.path.insert(0, "/scratch")
open("/scratch/math.py", "w").write("pi = 3")
sys.setrecursionlimit(50)
"""
    second = "import json, math, sys\nprint(math.pi > 3.14, sys.getrecursionlimit() > 50, json.dumps(1))"
    _, out2 = two_episodes(one_sandbox, first, second)
    assert out2 == "True True 1\n", out2


# --------------------------------------------------------------------- 4. resources outside RLIMIT_AS
def test_memfd_and_shared_mappings_are_refused_or_bounded(resource_env):
    code = """
import mmap, os
for attempt in ("memfd", "shared_anonymous", "dev_shm"):
    try:
        if attempt == "memfd":
            fd = os.memfd_create("hold")
            for _ in range(768):
                os.write(fd, b"x" * (1 << 20))
        elif attempt == "shared_anonymous":
            block = mmap.mmap(-1, 768 << 20, flags=mmap.MAP_SHARED)
            block.write(b"x" * (768 << 20))
        else:
            open("/dev/shm/hold", "wb").write(b"x" * (768 << 20))
        print(attempt, "HELD 768 MiB")
    except (OSError, MemoryError, ValueError) as e:
        print(attempt, type(e).__name__)
"""
    before = _meminfo_kb("MemAvailable")
    content, call = run(resource_env, code)
    assert call["status"] == "ok" and "HELD" not in content, content
    assert before - _meminfo_kb("MemAvailable") < 256 << 10
    assert_next_episode_works(resource_env)


def _host_root_can(probe: str) -> bool:
    """Whether this (root or unprivileged) host process can still take one of the per-user kernel resources."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    if probe == "inotify":
        fd = libc.inotify_init1(0)
        if fd >= 0:
            os.close(fd)
        return fd >= 0
    timer = ctypes.c_void_p()
    ok = libc.timer_create(1, None, ctypes.byref(timer)) == 0  # CLOCK_MONOTONIC; a pending-signal count holder
    if ok:
        libc.timer_delete(timer)
    return ok


PER_USER_FLOODS = {
    "inotify": "import ctypes, time\nl = ctypes.CDLL(None, use_errno=True)\n"
               "fds = [l.inotify_init1(0) for _ in range(300)]\nprint('inotify', sum(f >= 0 for f in fds), "
               "ctypes.get_errno())\ntime.sleep(1.5)",
    "signals": "import ctypes, signal, time\nl = ctypes.CDLL(None, use_errno=True)\n"
               "signal.signal(signal.SIGRTMIN, lambda *a: None)\n"
               "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])\nn = 0\n"
               "while n < 200000 and l.sigqueue(1, signal.SIGRTMIN, 0) == 0:\n    n += 1\n"
               "print('queued', n)\ntime.sleep(1.5)",
}


@pytest.mark.parametrize("kind", sorted(PER_USER_FLOODS))
def test_per_user_kernel_counts_are_not_the_hosts(env, kind):
    """inotify instances and queued signals are counted per user up the chain of user-namespace owners: an episode
    that holds as many as it can leaves the host process (root here) its own (the namespaces are owned by the
    sandbox uid, inotify is refused, RLIMIT_SIGPENDING is small)."""
    import threading

    probe = "inotify" if kind == "inotify" else "signals"
    seen: list[bool] = []
    timer = threading.Timer(0.8, lambda: seen.append(_host_root_can(probe)))
    timer.start()
    content, call = run(env, PER_USER_FLOODS[kind])
    timer.join()
    assert call["status"] == "ok", content
    if kind == "inotify":
        assert content.startswith("inotify 0 "), content  # refused outright
    else:
        assert int(content.split()[1]) <= 64, content  # RLIMIT_SIGPENDING
    assert seen == [True], "the host process could not get its own " + probe
    assert_next_episode_works(env)


def test_socket_buffers_and_ptys_take_no_kernel_memory_outside_the_limits(resource_env):
    """Socket buffers (kernel memory a memory cgroup would count, but not RLIMIT_AS) cannot be enlarged, and there are
    no ptys to take from the host-wide pool."""
    code = """
import os, socket
pairs, refused = [], 0
for _ in range(60):
    a, b = socket.socketpair()
    pairs.append((a, b))
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF, 32, 33):
        try:
            a.setsockopt(socket.SOL_SOCKET, option, 64 << 20)
        except OSError:
            refused += 1
    a.setblocking(False)
    try:
        while True:
            a.send(b"x" * 65536)
    except BlockingIOError:
        pass
print("refused", refused)
for path in ("/dev/ptmx", "/dev/pts/ptmx"):
    try:
        os.open(path, os.O_RDWR)
        print("PTY", path)
    except OSError as e:
        print("no pty", type(e).__name__)
"""
    before = _meminfo_kb("MemAvailable")
    content, call = run(resource_env, code)
    assert call["status"] == "ok" and "refused 240" in content and "PTY" not in content, content
    assert before - _meminfo_kb("MemAvailable") < 192 << 10, "socket buffers held more than 192 MiB"
    assert_next_episode_works(resource_env)


def test_scratch_size_and_inode_floods_are_capped(resource_env):
    slab = _meminfo_kb("Slab")
    code = f"""
import errno, os
try:
    with open("big", "wb") as f:
        for _ in range(64):
            f.write(b"x" * (1 << 20))
    print("BIG WRITTEN")
except OSError as e:
    print("big", errno.errorcode[e.errno], os.path.getsize("big") >> 20)
os.remove("big")
made = 0
try:
    for i in range(150_000):
        open(f"f{{i}}", "w").close()
        made += 1
except OSError as e:
    print("files", errno.errorcode[e.errno], made)
try:
    for i in range(150_000):
        os.mkdir(f"d{{i}}")
except OSError as e:
    print("dirs", errno.errorcode[e.errno])
"""
    content, call = run(resource_env, code)
    assert call["status"] == "ok" and "BIG WRITTEN" not in content, content
    assert f"big ENOSPC {SCRATCH_MB - 1}" in content or f"big ENOSPC {SCRATCH_MB}" in content, content
    made = int(content.split("files ENOSPC ")[1].split()[0])
    assert made < MAX_FILES, content  # the inode cap, not 150k files
    assert _meminfo_kb("Slab") - slab < 32 << 10
    assert_next_episode_works(resource_env)


def test_thread_floods_stop_at_the_cap(resource_env, resource_tool):
    code = """
import threading, time
threading.stack_size(64 * 1024)
stop = threading.Event()
started = 0
try:
    for _ in range(2000):
        threading.Thread(target=stop.wait).start()
        started += 1
except RuntimeError as e:
    print("refused", e)
print("STARTED", started)
stop.set()
"""
    content, call = run(resource_env, code)
    if thread_cap_in_force(resource_tool):
        started = int(content.split("STARTED ")[1].split()[0])
        assert started < MAX_THREADS and "refused" in content, content
    else:  # a non-root host without a pids cgroup: documented as not capped, only RLIMIT_AS stops the flood; where
        # it runs out inside a new thread before that thread reports back, CPython's Thread.start() waits forever
        # (seen as uid 65534: ~490 threads fit in 256 MiB): the call then times out. Either way the env holds.
        assert "STARTED " in content or call["status"] in ("timeout", "crashed"), content
    assert_next_episode_works(resource_env)


def test_memory_the_kernel_holds_counts_against_the_limit(resource_env, resource_tool):
    """Heap within RLIMIT_AS plus socket buffers the kernel holds for the REPL: over the memory limit together."""
    code = f"""
import socket
before = 1
heap = bytearray({MEMORY_MB - 96} << 20)
pairs = []
try:
    for _ in range(100):
        a, b = socket.socketpair()
        a.setblocking(False)
        for _ in range(400):
            a.send(b"x" * 4096)
        pairs.append((a, b))
except OSError as e:
    print("buffers", type(e).__name__, len(pairs))
print("HELD", len(pairs))
"""
    content, call = run(resource_env, code)
    if memory_cgroup_in_force(resource_tool):  # the cgroup counts heap + socket buffers: held, or killed
        assert call["status"] in ("ok", "crashed"), content
        if call["status"] == "crashed":
            assert "memory limit" in content, content
    else:
        assert call["status"] in ("ok", "error"), content
    assert_next_episode_works(resource_env)


# ------------------------------------------------------------------------------------ 5. reply channel
FORGE = """
import json, os
frame = json.dumps({"status": "ok", "output": "FORGED" * 100, "omitted_chars": 0, "error": ""}).encode()
forged = len(frame).to_bytes(4, "big") + frame
def forge_everywhere():
    hits = 0
    for fd in range(0, 1024):
        try:
            os.write(fd, forged * 3)
            hits += 1
        except OSError:
            pass
    return hits
"""


def test_forged_frames_on_every_fd_change_no_result(env):
    """Writing frames into every fd reaches, at most, this call's own reply pipe; the relay (outside the REPL) sees
    more than one reply there and restarts the REPL instead of passing anything on. Later calls get their own
    results."""
    content, call = run(env, FORGE + "print('hits', forge_everywhere() >= 0)")
    assert call["status"] == "crashed" and "reply channel" in content and "FORGED" not in content, content
    for word in ("second", "third"):
        content, call = run(env, f"print({word!r})")
        assert call["status"] == "ok" and content == f"{word}\n", content
    assert_next_episode_works(env)


def test_a_thread_forging_during_later_calls_changes_no_result(env):
    code = FORGE + """
import threading, time
def keep_forging():
    end = time.time() + 1.5
    while time.time() < end:
        forge_everywhere()
        time.sleep(0.001)
threading.Thread(target=keep_forging).start()
print("started")
"""
    content, _ = run(env, code)
    assert "FORGED" not in content
    for index in range(5):  # each call: its own output, or the tampering detected and the REPL restarted
        content, call = run(env, f"import time\ntime.sleep(0.2)\nprint('call', {index})")
        assert "FORGED" not in content, content
        assert (call["status"], content) == ("ok", f"call {index}\n") or (
            call["status"] == "crashed" and "reply channel" in content), content
    assert_next_episode_works(env)


@pytest.mark.parametrize("code", [
    "print('x' * 100_000)",
    "import sys\nfor _ in range(10_000):\n    sys.stdout.write('y' * 50)",
    "import sys\nsys.stderr.write('z' * 100_000)",
    "'w' * 1_000_000",
    "raise ValueError('v' * 1_000_000)",
    "import sys\nsys.stdout = None\nprint('gone')",
    "import sys\nclass Loud:\n    def write(self, text):\n        raise RuntimeError('no')\nsys.stdout = Loud()\nprint('x')",
    "class Bad(Exception):\n    def __str__(self):\n        raise RuntimeError('cannot say')\nraise Bad()",
    "x = []\nfor _ in range(100_000):\n    x = [x]\nx",
    "print('\\ud800 \\x00 \\x1b[31m \\udfff')",
    "import os\nos.close(1)\nos.close(2)\nprint('closed')",
], ids=["print", "write-loop", "stderr", "repr", "exception", "stdout-none", "stdout-raises", "bad-exception",
        "deep-repr", "surrogates", "closed-fds"])
def test_output_is_capped_and_cleaned_whatever_the_stream(env, code):
    content, call = run(env, code)
    assert call["status"] in ("ok", "error"), content
    assert len(content) < LIMITS["max_output_chars"] + LIMITS["max_error_chars"] + 300, len(content)
    content.encode("utf-8")  # no lone surrogates reach the env
    content, call = run(env, "print('after')")
    assert content == "after\n"
    assert_next_episode_works(env)


@pytest.mark.parametrize("reply", [  # within the env's 16,384-character action limit (longer actions are refused)
    '<tool_call>{"name": "python", "arguments": ' + "[" * 7_000 + "]" * 7_000 + "}</tool_call>",
    '<tool_call>{"name": "python", "arguments": "' + "[" * 14_000 + '"}</tool_call>',
    '<tool_call>{"name": "python", "arguments": {"code": ' + '{"a":' * 2_500 + "1" + "}" * 2_500 + "}}</tool_call>",
    '<tool_call>{"name": "python", "arguments": [1, 2]}</tool_call>',
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "python", "arguments": {"code": 42}}</tool_call>',
    "<tool_call>not json at all",
    "```python\nprint('unclosed')",
], ids=["deep-json", "deep-json-string", "deep-code-object", "list-arguments", "unknown-tool", "code-not-text",
        "unclosed-tag", "unclosed-fence"])
def test_malformed_tool_calls_are_error_messages(env, reply):
    _, reward, terminated, truncated, info = env.step(reply)
    message = env.unwrapped.episode.messages[-1]
    assert message.role == "tool" and not terminated and reward == 0.0
    assert "error" in message.content.lower() or "Error" in message.content, message.content[:300]
    assert len(message.content) < 4000
    assert_next_episode_works(env)
