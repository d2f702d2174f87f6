"""Hostile code against the real Python sandbox (continued from ``test_sandbox_attacks.py``, whose docstring has the
method): 3. state that survives an episode (files, xattrs, limits, IPC, lingering threads, interpreter state) and
5. the reply channel (forged frames on every fd, from threads, output caps, broken streams, malformed calls).
"""

from __future__ import annotations

import os

import pytest

from gym_llm.tools import PythonTool
from gym_llm.tools.base import ToolCall
# the fixtures (autouse: private_tmp, host_unchanged) are sandbox_attacks.py's
from tests.tools.sandbox_attacks import (LIMITS, MEMORY_MB, assert_next_episode_works, env,  # noqa: F401
                                         host_unchanged, private_tmp, run, tool)


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
