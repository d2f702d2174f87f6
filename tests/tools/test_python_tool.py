"""PythonTool: REPL semantics, limits, episode isolation, the pool, errors, pickling."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gym_llm.tools.sandbox.process import pidfd_pid
from gym_llm.tools import PythonTool, SandboxConfig, ToolCall
from gym_llm.tools.sandbox import SandboxUnavailableError


def call(session, code: str):
    return session.run(ToolCall("python", {"code": code}))


@pytest.fixture(scope="module")
def tool():
    tool = PythonTool(timeout_s=5.0, memory_limit_mb=512, max_output_chars=500, min_idle=1)
    tool.attach()
    yield tool
    tool.detach()


@pytest.fixture
def session(tool):
    session = tool.open_session()
    yield session
    session.close()


def test_repl_persists_state_and_shows_the_last_expression(session):
    assert call(session, "x = 20").content == "(no output)"
    assert call(session, "import math\nx += 1\nx * 2").content == "42\n"
    result = call(session, "print('hi')\nmath.sqrt(x + 4)")
    assert (result.status, result.content, result.truncated) == ("ok", "hi\n5.0\n", False)
    assert call(session, "None").content == "(no output)"


def test_errors_come_back_as_tracebacks_of_the_cell(session):
    result = call(session, "def f(n):\n    return 1 / n\n\nprint('before')\nf(0)")
    assert result.status == "error"
    assert result.content.startswith("before\nTraceback (most recent call last):")
    assert 'File "<cell 1>", line 2, in f' in result.content and "ZeroDivisionError: division by zero" in result.content
    assert "server" not in result.content  # the REPL's own frames are hidden
    result = call(session, "def broken(:\n    pass")
    assert result.status == "error" and "SyntaxError" in result.content
    result = call(session, "import sys\nsys.exit(3)")
    assert result.status == "error" and "SystemExit: 3" in result.content
    assert call(session, "print('still here')").content == "still here\n"


def _descendants(pid: int) -> list[int]:
    try:
        children = [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
                    for c in (t / "children").read_text().split()]
    except FileNotFoundError:  # it ended while the tree was walked
        return []
    return children + [d for c in children for d in _descendants(c)]


_SANDBOX_OWNER = """
import json, time
from gym_llm.tools import PythonTool, ToolCall

tool = PythonTool(timeout_s=5.0, min_idle=1)
tool.attach()
session = tool.open_session()
repl_pid = session.run(ToolCall("python", {"code": "import os\\nos.getpid()"})).content.strip()
tool.pool.prewarm(2, wait=True)  # one in use, one idle
bwrap_pids = [session._sandbox.process.pid] + [s.process.pid for s in tool.pool._idle]
print(json.dumps({"bwrap": bwrap_pids, "repl_pid_in_sandbox": int(repl_pid)}), flush=True)
time.sleep(120)
"""


def _identity(pid: int) -> tuple[int, str] | None:
    """``(pid, start time)`` of a live (not zombie) process, else None; the start time tells a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return None if fields[0] in "ZX" else (pid, fields[19])


def _namespace_pid(pid: int) -> int:
    """The pid a process has inside its innermost pid namespace (the last ``NSpid`` field)."""
    line = next(row for row in Path(f"/proc/{pid}/status").read_text().splitlines() if row.startswith("NSpid:"))
    return int(line.split()[-1])


def test_sandboxes_die_with_the_host_process():
    """SIGKILL the host process: bwrap's --die-with-parent (PR_SET_PDEATHSIG) takes every sandbox process with it."""
    repo = Path(__file__).resolve().parents[2]
    owner = subprocess.Popen([sys.executable, "-c", _SANDBOX_OWNER], stdout=subprocess.PIPE, text=True, cwd=repo,
                             env={**os.environ, "PYTHONPATH": str(repo)})
    watched: list[tuple[int, str]] = []
    try:
        report = json.loads(owner.stdout.readline())
        trees = {pid: [pid, *_descendants(pid)] for pid in report["bwrap"]}
        # bwrap -> bwrap init -> zygote (-> REPL, and a pre-forked spare in the sandbox in use)
        assert len(trees) == 2 and all(len(tree) >= 3 for tree in trees.values()), trees
        in_use = trees[report["bwrap"][0]]
        assert report["repl_pid_in_sandbox"] in [_namespace_pid(pid) for pid in in_use[1:]]  # the REPL is watched
        watched = [identity for tree in trees.values() for pid in tree if (identity := _identity(pid))]
        assert len(watched) == sum(len(tree) for tree in trees.values())
        for pid, _ in watched:  # frozen: only the kernel's parent-death SIGKILLs can end them now, not
            os.kill(pid, signal.SIGSTOP)  # e.g. the zygote noticing that its control socket closed
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        deadline = time.monotonic() + 10.0
        alive = watched
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [(pid, start) for pid, start in alive if _identity(pid) == (pid, start)]
        assert alive == [], f"sandbox processes outlived their host process: {alive}"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        for pid, start in watched:  # never leave a sandbox behind, even when the test fails
            if _identity(pid) == (pid, start):
                os.kill(pid, signal.SIGKILL)
        owner.stdout.close()


def test_a_repl_killed_from_outside_is_replaced_on_the_next_call(session):
    assert call(session, "x = 1\nimport os\nos.getpid()").status == "ok"
    repl_host_pid = pidfd_pid(session._channel.pidfd)  # the zygote hands the host a pidfd of each REPL
    assert repl_host_pid in _descendants(session._sandbox.process.pid)  # bwrap -> init -> zygote -> relay -> REPL
    os.kill(repl_host_pid, signal.SIGKILL)  # e.g. the kernel's OOM killer
    while Path(f"/proc/{repl_host_pid}/stat").read_text().split()[2] != "Z":  # until it has exited
        time.sleep(0.01)
    result = call(session, "print('x' in dir())")
    assert result.status == "ok" and result.content.startswith("[The previous Python session had ended")
    assert result.content.endswith("False\n")
    assert call(session, "print(2 + 2)").content == "4\n"


def test_output_cap_has_a_visible_marker(session):
    result = call(session, "print('a' * 1000)")
    assert result.truncated and result.content.startswith("a" * 500)
    assert "[... 501 more characters of output truncated ...]" in result.content


def test_invalid_arguments_are_an_invalid_call(session):
    result = session.run(ToolCall("python", {"source": "1"}))
    assert result.status == "invalid" and '{"code": "<python source>"}' in result.content
    assert session.run(ToolCall("python", {"code": 5})).status == "invalid"


def test_episodes_are_isolated_and_sandboxes_are_reused(tool):
    first = tool.open_session()
    assert call(first, "secret = 'ep1'\nopen('/scratch/note.txt', 'w').write('ep1')\nimport os\nos.getpid()").status == "ok"
    first.close()
    spawned = tool.pool.spawned
    for _ in range(5):
        session = tool.open_session()
        result = call(session, "import os\nprint('secret' in dir(), os.listdir('.'), os.getcwd())")
        assert result.content == "False [] /scratch\n"
        session.close()
    assert tool.pool.spawned <= spawned + 1  # a fresh REPL per episode, not a fresh sandbox (+1: the spare)


def test_sessions_run_in_parallel_threads(tool):
    tool.prewarm(4)
    sessions = [tool.open_session() for _ in range(4)]
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda i: call(sessions[i], f"v = {i}\nimport time\ntime.sleep(0.2)\nv * 10"),
                                    range(4)))
        assert [r.content for r in results] == ["0\n", "10\n", "20\n", "30\n"]
    finally:
        for session in sessions:
            session.close()


def test_rlimits_file_size_open_files_scratch_size_and_cpu():
    tool = PythonTool(file_size_limit_mb=1, max_open_files=32, scratch_size_mb=4, cpu_limit_s=1, timeout_s=8,
                      min_idle=0)
    tool.attach()
    session = tool.open_session()
    try:
        result = call(session, "open('big', 'wb').write(b'x' * (2 << 20))")
        assert result.status == "error" and "File too large" in result.content
        result = call(session, "files = [open(f'f{i}', 'w') for i in range(64)]")
        assert result.status == "error" and "Too many open files" in result.content
        result = call(session, "for i in range(16):\n    open(f'chunk{i}', 'wb').write(b'x' * 1000_000)")
        assert result.status == "error" and "No space left on device" in result.content
        result = call(session, "while True:\n    pass")
        assert result.status == "crashed" and "CPU time limit of 1 s" in result.content
        assert call(session, "1 + 1").content == "2\n"
    finally:
        session.close()
        tool.detach()


def test_site_packages_and_preload_are_opt_in():
    bare = PythonTool(site_packages=False, preload=("fractions",), min_idle=0)
    bare.attach()
    session = bare.open_session()
    try:
        assert "ModuleNotFoundError" in call(session, "import numpy").content
        assert call(session, "import sys\n'fractions' in sys.modules").content == "True\n"
    finally:
        session.close()
        bare.detach()


def test_host_paths_under_tmp_are_bound_below_run_host(tmp_path):
    """A checkout or venv under /tmp (a CI clone): bound read-only below /run/host; /tmp stays the scratch dir."""
    assert str(tmp_path).startswith("/tmp/")
    tmp_path.chmod(0o755)  # readable by the REPL's unprivileged uid (pytest makes it 0700)
    (tmp_path / "hostmod.py").write_text("VALUE = 41 + 1\n")
    tool = PythonTool(extra_ro_paths=(str(tmp_path),), min_idle=0)
    tool.attach()
    session = tool.open_session()
    try:
        code = (f"import sys\nsys.path.insert(0, '/run/host{tmp_path}')\nimport hostmod\n"
                "open('/tmp/a.txt', 'w').write('ok')\nprint(hostmod.VALUE, open('/scratch/a.txt').read())\n"
                f"open('/run/host{tmp_path}/hostmod.py', 'a')")
        content = call(session, code).content
        # refused: read-only mount, and (on a root host) not the REPL's file anyway
        assert content.startswith("42 ok\n") and ("Read-only file system" in content or "Permission denied" in content)
    finally:
        session.close()
        tool.detach()


def test_unavailable_bubblewrap_fails_at_construction_with_the_fix():
    with pytest.raises(SandboxUnavailableError, match="isolation='none'") as excinfo:
        PythonTool(bwrap_path="/bin/false")
    assert "unprivileged_userns_clone" in str(excinfo.value)
    with pytest.raises(SandboxUnavailableError, match="not an executable"):
        PythonTool(bwrap_path="/nonexistent/bwrap")


def test_bad_arguments_are_rejected():
    with pytest.raises(TypeError, match="Unknown PythonTool argument"):
        PythonTool(timeout=3)
    with pytest.raises(ValueError, match="timeout_s must be a number > 0"):
        PythonTool(timeout_s=0)
    with pytest.raises(ValueError, match="isolation must be"):
        SandboxConfig(isolation="docker")
    with pytest.raises(ValueError, match="memory_limit_mb must be >= 64"):
        SandboxConfig(memory_limit_mb=8)


def test_pickled_tool_is_a_detached_spec(tool):
    clone = pickle.loads(pickle.dumps(tool))
    assert clone.config == tool.config and clone._pool is None
    clone.attach()
    session = clone.open_session()
    try:
        assert call(session, "6 * 7").content == "42\n"
    finally:
        session.close()
        clone.detach()


def test_allow_subprocess_runs_children_and_uses_a_fresh_sandbox_per_episode():
    tool = PythonTool(allow_subprocess=True, min_idle=0)
    tool.attach()
    try:
        session = tool.open_session()
        result = call(session, "import subprocess, sys\n"
                               "subprocess.run([sys.executable, '-I', '-S', '-c', 'print(6 * 7)'], check=True)\n"
                               "print(subprocess.run([sys.executable, '-I', '-S', '-c', 'print(1)'],"
                               " capture_output=True, text=True).stdout)")
        assert result.status == "ok" and result.content == "1\n\n", result.content
        first = session._sandbox
        session.close()
        assert not first.alive  # killed, with anything its children left behind
        session = tool.open_session()
        assert call(session, "1").content == "1\n" and session._sandbox is not first
        session.close()
    finally:
        tool.detach()


def test_forked_child_gets_its_own_pool(tool):
    """AsyncVectorEnv's fork workers inherit attached tools: they must not use the parent's sandboxes."""
    parent_pool = tool.pool
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            tool.attach()
            session = tool.open_session()
            own_pool = tool.pool is not parent_pool
            os.write(write_fd, f"{own_pool} {call(session, '6 * 7').content.strip()}".encode())
            session.close()
            tool.detach()
        finally:
            os._exit(0)
    os.close(write_fd)
    report = os.read(read_fd, 1024).decode()
    os.close(read_fd)
    os.waitpid(child, 0)
    assert report == "True 42" and tool.pool is parent_pool


def test_forked_child_starts_its_sandboxes_while_the_parent_is_starting_one(tool):
    """A fork while the parent's spawner thread is inside a sandbox start (holding the process's cgroup and user
    namespace locks): the child's own pool must still start sandboxes (it hung 30 s, then failed, when it inherited
    those locks held)."""
    from gym_llm.tools.sandbox import cgroups, userns

    held, done = threading.Event(), threading.Event()

    def spawner_mid_start() -> None:
        with cgroups.SandboxCgroup._lock, userns._LOCK:
            held.set()
            done.wait()

    thread = threading.Thread(target=spawner_mid_start, daemon=True)
    thread.start()
    assert held.wait(5)
    read_fd, write_fd = os.pipe()
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through the pipe
            try:
                signal.alarm(20)  # a hang ends the child; the parent then reads nothing
                tool.attach()
                session = tool.open_session()
                os.write(write_fd, call(session, "6 * 7").content.strip().encode())
                session.close()
                tool.detach()
            finally:
                os._exit(0)
    finally:
        done.set()
        thread.join()
    os.close(write_fd)
    report = os.read(read_fd, 1024).decode()
    os.close(read_fd)
    os.waitpid(child, 0)
    assert report == "42"
