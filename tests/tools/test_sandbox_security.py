"""Hostile snippets against the real sandbox, run through ``env.step`` of ``LLMPythonTool-v0``.

Each test asserts the specific containment and then that the next step works normally (and, where
the snippet broke the REPL, that the restart is reported). Limits are short so the suite stays fast.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys

import pytest

from gym_llm.envs.python_tool import LLMPythonToolEnv
from gym_llm.tools import PythonTool

TIMEOUT_S = 1.5  # the tests that assert a timeout (quick_env)
ROOMY_TIMEOUT_S = 20.0  # everything else: no test may depend on the machine being idle
HOST_SECRET = "gym-llm-host-secret-" + secrets.token_hex(8)
TASKS = [{"question": "What is 6 times 7?", "answer": "6 * 7 = 42\n#### 42"}]


@pytest.fixture(scope="module")
def tool():
    os.environ["GYM_LLM_TEST_HOST_SECRET"] = HOST_SECRET  # in the host env when sandboxes are spawned
    tool = PythonTool(timeout_s=ROOMY_TIMEOUT_S, memory_limit_mb=256, cpu_limit_s=20, max_output_chars=2000,
                      min_idle=2)
    tool.attach()
    yield tool
    tool.detach()
    os.environ.pop("GYM_LLM_TEST_HOST_SECRET", None)


@pytest.fixture
def env(tool):
    env = LLMPythonToolEnv(tasks=TASKS, python_tool=tool, max_turns=20, max_observation_chars=1 << 20)
    env.reset(seed=0)
    yield env
    env.close()


@pytest.fixture(scope="module")
def quick_tool():
    """For the tests that assert a timeout: a 1.5 s wall clock, so they wait little. Every other test uses the
    default tool's 20 s: code whose CPU work is real (touching 256 MiB of pages, a ptrace probe in a child, writes)
    overran 1.5 s under a loaded suite on an AMD EPYC (seen as root and as uid 65534)."""
    tool = PythonTool(timeout_s=TIMEOUT_S, memory_limit_mb=256, cpu_limit_s=20, max_output_chars=2000, min_idle=1)
    tool.attach()
    yield tool
    tool.detach()


@pytest.fixture
def quick_env(quick_tool):
    env = LLMPythonToolEnv(tasks=TASKS, python_tool=quick_tool, max_turns=20, max_observation_chars=1 << 20)
    env.reset(seed=0)
    yield env
    env.close()


def run(env, code: str) -> tuple[str, dict]:
    """Step with a reply holding one python block; return the tool message text and the call's info."""
    before = len(env.unwrapped.episode.messages)
    _, reward, terminated, truncated, info = env.step(f"Let me try.\n```python\n{code}\n```")
    assert (reward, terminated, truncated) == (0.0, False, False)
    [call] = json.loads(info["tool_calls"])
    [message] = env.unwrapped.episode.messages[before + 1:]
    assert message.role == "tool"
    return message.content, call


def assert_next_step_works(env, *, fresh: bool = False) -> None:
    content, call = run(env, "marker = 6 * 7\nprint(marker)")
    assert call["status"] == "ok" and content.strip() == "42"
    if fresh:  # the REPL was restarted: earlier variables are gone
        content, call = run(env, "print('before' in dir())")
        assert content.strip() == "False"
    _, reward, terminated, _, info = env.step("The answer is\n#### 42")
    assert terminated and reward == 1.0 and info["correct"]


def test_network_connect_to_host_listener_receives_nothing(env):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = f"""
import socket, urllib.request
for attempt in (lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1),
                lambda: urllib.request.urlopen("http://127.0.0.1:{port}/", timeout=1),
                lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM),
                lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM),
                lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)):
    try:
        attempt()
        print("CONNECTED")
    except Exception as e:
        print(type(e).__name__, e)
"""
    try:
        content, call = run(env, code)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert call["status"] == "ok" and "CONNECTED" not in content
    assert content.count("Operation not permitted") + content.count("Permission") >= 4, content
    assert_next_step_works(env)


def test_read_secret_file_outside_scratch(env, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(HOST_SECRET)
    code = f"""
import os
for path in [{str(secret)!r}, "/etc/shadow", "/etc/passwd", "/root/.bash_history", "/proc/1/environ"]:
    try:
        print(path, open(path).read()[:200])
    except Exception as e:
        print(path, type(e).__name__)
print(dict(os.environ))
"""
    content, call = run(env, code)
    assert HOST_SECRET not in content
    assert f"{secret} FileNotFoundError" in content and "/etc/passwd FileNotFoundError" in content
    assert "GYM_LLM_TEST_HOST_SECRET" not in content
    assert_next_step_works(env)


def test_write_outside_scratch(env, tmp_path):
    targets = [sys.base_prefix + "/pwned", os.path.dirname(os.__file__) + "/pwned", "/usr/lib/pwned",
               "/pwned", "/dev/pwned", str(tmp_path / "pwned")]
    code = f"""
for path in {targets!r}:
    try:
        open(path, "w").write("pwned")
        print(path, "WRITTEN")
    except OSError as e:
        print(path, type(e).__name__, e.strerror)
open("inside.txt", "w").write("ok")
print(open("/scratch/inside.txt").read(), open("/tmp/inside.txt").read())
"""
    content, call = run(env, code)
    assert "WRITTEN" not in content and "okok" in content.replace(" ", "")
    assert content.count("Read-only file system") >= 4, content
    for path in targets:
        assert not os.path.exists(path), path
    assert_next_step_works(env)


def test_fork_bomb(env):
    content, call = run(env, "import os\nbefore = 1\nwhile True:\n    os.fork()")
    assert call["status"] == "error" and "PermissionError" in content
    content, call = run(env, "import subprocess\nsubprocess.run(['/bin/sh', '-c', 'echo hi'])")
    assert call["status"] == "error" and "PermissionError" in content
    content, call = run(env, "import multiprocessing\nmultiprocessing.Process(target=print).start()")
    assert call["status"] == "error"
    content, call = run(env, "import os\nos.execv('/usr/bin/true', ['true'])")
    assert call["status"] == "error" and "PermissionError" in content
    assert_next_step_works(env)


def test_memory_bomb(env):
    content, call = run(env, "before = 1\nblob = bytearray(8 * 1024**3)")
    assert call["status"] == "error" and "MemoryError" in content and "memory limit is 256 MiB" in content
    content, call = run(env, "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024**2))")
    assert call["status"] == "error" and "MemoryError" in content
    run(env, "del chunks")
    content, call = run(env, "print(before)")  # a MemoryError does not cost the session
    assert content.strip() == "1"
    assert_next_step_works(env)


def test_infinite_loop_times_out_and_restarts(quick_env):
    env = quick_env
    content, call = run(env, "before = 1\nwhile True:\n    pass")
    assert call["status"] == "timeout" and call["duration_s"] >= TIMEOUT_S
    assert f"{TIMEOUT_S:g} s limit" in content and "restarted" in content
    assert_next_step_works(env, fresh=True)


def test_cpu_loop_ignoring_signals(quick_env):
    env = quick_env
    code = """
import signal
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGXCPU, signal.SIGALRM, signal.SIGHUP, signal.SIGUSR1):
    signal.signal(sig, signal.SIG_IGN)
before = 1
x = 0
while True:
    x += 1
"""
    content, call = run(env, code)
    assert call["status"] == "timeout" and "restarted" in content
    assert_next_step_works(env, fresh=True)


def test_killing_the_parent_process(env):
    code = f"""
import os, signal
before = 1
for pid in ({os.getpid()}, os.getppid(), 0, -1, 2, 3):
    try:
        os.kill(pid, signal.SIGKILL)
        print(pid, "KILLED")
    except Exception as e:
        print(pid, type(e).__name__)
"""
    content, call = run(env, code)
    # signals may only target the REPL itself (pid 1 of its own namespace): not the host, the zygote or the relay
    assert call["status"] == "ok" and "KILLED" not in content and content.count("PermissionError") == 6, content
    content, call = run(env, "print(before)")  # nothing died: the session keeps its state
    assert content == "1\n"
    assert_next_step_works(env)


def test_gigantic_output_is_capped(env):
    content, call = run(env, "print('x' * 50_000_000)")
    assert call["status"] == "ok" and call["truncated"]
    assert len(content) < 2200 and "more characters of output truncated" in content
    content, call = run(env, "for i in range(100_000):\n    print(i)")
    assert call["truncated"] and content.startswith("0\n1\n2\n") and "truncated" in content
    assert_next_step_works(env)


def test_proc_snooping_sees_nothing(env):
    code = """
import os
print("PIDS", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), os.getpid())
for pid in (1, 2, 3):
    for name in ("cmdline", "environ", "mem", "fd"):
        try:
            print(pid, name, os.listdir(f"/proc/{pid}/{name}") if name == "fd" else open(f"/proc/{pid}/{name}", "rb").read(100))
        except Exception as e:
            print(pid, name, type(e).__name__)
"""
    content, call = run(env, code)
    assert content.startswith("PIDS [] 1\n"), content  # alone in its pid namespace, and no procfs at all
    assert content.count("FileNotFoundError") == 12 and HOST_SECRET not in content, content
    assert_next_step_works(env)


def test_symlink_escape_from_scratch(env, tmp_path):
    secret = tmp_path / "linked_secret.txt"
    secret.write_text(HOST_SECRET)
    code = f"""
import os
os.symlink({str(secret)!r}, "to_secret")
os.symlink("/etc/passwd", "to_passwd")
os.symlink("../../../../../../", "to_root")
for name in ("to_secret", "to_passwd"):
    try:
        print(name, open(name).read())
    except Exception as e:
        print(name, type(e).__name__)
print("ROOT", sorted(os.listdir("to_root")))
"""
    content, call = run(env, code)
    assert HOST_SECRET not in content
    assert "to_secret FileNotFoundError" in content and "to_passwd FileNotFoundError" in content
    root = content.split("ROOT ", 1)[1]
    assert "'scratch'" in root and not {"'home'", "'var'", "'boot'", "'bin'"} & set(root.strip("[]\n").split(", "))
    assert_next_step_works(env)


def test_ptrace_is_denied(env):
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for request, pid in ((0, 0), (16, 1), (16, os.getppid()), (0x4206, 1)):  # TRACEME, ATTACH, SEIZE
    result = libc.ptrace(request, pid, 0, 0)
    print(request, pid, result, ctypes.get_errno())
print(libc.unshare(0x10000000), ctypes.get_errno())  # CLONE_NEWUSER
print(libc.shmget(0, 4096, 0o1600), ctypes.get_errno())  # IPC_CREAT: would outlive the episode
print(libc.mount(b"none", b"/scratch", b"tmpfs", 0, None), ctypes.get_errno())
"""
    content, call = run(env, code)
    lines = [line.split() for line in content.strip().splitlines()]
    assert all(line[-2:] == ["-1", "1"] for line in lines[:-1]), content  # -1, EPERM
    # mount is a call only the host's tracer may inject (copy-on-write forks): with none attached, ENOSYS
    assert lines[-1] == ["-1", "38"], content
    assert_next_step_works(env)


def test_ctypes_segfault_restarts_the_repl(env):
    content, call = run(env, "before = 1\nimport ctypes\nctypes.string_at(0)")
    assert call["status"] == "crashed" and "SIGSEGV" in content and "restarted" in content
    assert_next_step_works(env, fresh=True)


def test_unsafe_mode_is_not_a_sandbox(tmp_path):
    """isolation='none' keeps seccomp and rlimits but not the filesystem: documented as unsafe."""
    secret = tmp_path / "visible.txt"
    secret.write_text(HOST_SECRET)
    tool = PythonTool(isolation="none", timeout_s=TIMEOUT_S, min_idle=0)
    env = LLMPythonToolEnv(tasks=TASKS, python_tool=tool, max_turns=8)
    try:
        env.reset(seed=0)
        content, _ = run(env, f"print(open({str(secret)!r}).read())")
        assert HOST_SECRET in content
        content, call = run(env, "import os\nos.fork()")
        assert call["status"] == "error" and "PermissionError" in content
        assert_next_step_works(env)
    finally:
        env.close()
