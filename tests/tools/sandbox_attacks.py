"""What the sandbox attack modules share (``test_sandbox_attacks.py``, ``test_sandbox_attacks_episodes.py``,
``test_sandbox_attacks_resources.py``): the tool under attack and its envs, the step helper, the check that the next
episode works, and the autouse check that the host is unchanged after every attack. Each module imports the fixtures
it uses by name (module-scoped ones are then made once per module).
"""

from __future__ import annotations

import json
import os
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
    LIVE_TOOLS.remove(tool)  # the next module's tool is the live one
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
