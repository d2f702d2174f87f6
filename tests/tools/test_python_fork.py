"""Forking an episode of a Python-tool env: the sibling's REPL holds the parent's variables, imports and files, and
each sibling is as isolated from the others as two episodes are (tested both ways, as root here and as an
unprivileged user in tests/tools/test_sandbox_unprivileged.py)."""

from __future__ import annotations

import os
import time

import pytest

from gym_llm.core.episode import ForkError
from gym_llm.envs.chat import LLMChatEnv
from gym_llm.tools import PythonTool
from gym_llm.tools.sandbox.cowfork import unsupported_reason
from gym_llm.tools.sandbox.process import pidfd_pid

cow = pytest.mark.skipif(unsupported_reason() is not None, reason=f"copy-on-write forks: {unsupported_reason()}")
"""Copy-on-write forks need x86-64 Linux >= 5.6 (every machine of this project and its CI); elsewhere forks re-run
calls, which the other tests here cover."""


def _code(source: str) -> str:
    return f"```python\n{source}\n```"


def _out(env) -> str:
    return env.episode.messages[-1].content


@pytest.fixture
def env():
    env = LLMChatEnv(prompts=["Use Python."], tools=[PythonTool(min_idle=0, timeout_s=20)], max_turns=12)
    env.reset(seed=0)
    yield env
    env.close()


def _session(env):
    return next(iter(env.episode.resources["gym_llm.tools"]._sessions.values()))


def test_a_fork_has_the_parents_variables_imports_and_files(env):
    env.step(_code("import json\nx = [1, 2, 3]\nopen('f.txt', 'w').write('parent')\nprint('built')"))
    assert _out(env) == "built\n"
    (sibling,) = env.fork()
    sibling.step(_code("x.append(4)\nprint(json.dumps(x), open('f.txt').read())"))
    assert _out(sibling) == "[1, 2, 3, 4] parent\n"
    assert _session(sibling).fork_exact is True
    env.step(_code("print(x)"))  # the sibling's append did not reach the parent's list
    assert _out(env) == "[1, 2, 3]\n"
    sibling.close()


def test_siblings_cannot_see_each_others_writes_either_way(env):
    env.step(_code("shared = {'n': 0}\nopen('base.txt', 'w').write('0')"))
    a, b = env.fork(2)
    a.step(_code("shared['n'] = 1\nsecret_a = 'A'\nopen('a.txt', 'w').write('A')\nopen('base.txt', 'w').write('A')"))
    b.step(_code("shared['n'] = 2\nsecret_b = 'B'\nopen('b.txt', 'w').write('B')"))
    probe = ("import os\nprint(shared['n'], 'secret_a' in globals(), 'secret_b' in globals(), "
             "sorted(os.listdir('.')), open('base.txt').read())")
    for who, sibling, want in [
            ("a", a, "1 True False ['a.txt', 'base.txt', 'f'] A"),
            ("b", b, "2 False True ['b.txt', 'base.txt', 'f'] 0"),
            ("parent", env, "0 False False ['base.txt', 'f'] 0")]:
        sibling.step(_code("open('f', 'w').close()\n" + probe))
        assert _out(sibling) == want + "\n", who
    a.close()
    b.close()


def test_closing_the_parent_leaves_the_siblings_working(env):
    env.step(_code("total = 40"))
    a, b = env.fork(2)
    a.step(_code("total += 1"))
    env.close()
    a.step(_code("print(total)"))
    b.step(_code("print(total + 2)"))
    assert (_out(a), _out(b)) == ("41\n", "42\n")
    a.close()
    b.step(_code("print('still here')"))
    assert _out(b) == "still here\n"
    b.close()


def test_a_fork_of_a_fork_and_a_fork_before_any_call(env):
    (early,) = env.fork()  # nothing ran yet: nothing to rebuild
    env.step(_code("a = 1"))
    (child,) = env.fork()
    child.step(_code("b = a + 1"))
    (grandchild,) = child.fork()
    grandchild.step(_code("print(a, b)"))
    early.step(_code("print('a' in globals())"))
    assert (_out(grandchild), _out(early)) == ("1 2\n", "False\n")
    for e in (early, child, grandchild):
        e.close()


def _env(**limits):
    env = LLMChatEnv(prompts=["Use Python."], tools=[PythonTool(min_idle=0, **limits)], max_turns=12)
    env.reset(seed=0)
    return env


def test_replayed_forks_of_code_that_reads_randomness_are_inexact_and_say_so():
    env = _env(timeout_s=20, fork="replay")
    try:
        env.step(_code("import os\ntoken = os.urandom(8).hex()\nprint(token)"))
        parent_token = _out(env).strip()
        (sibling,) = env.fork()
        sibling.step(_code("print(token)"))
        assert _out(sibling).strip() != parent_token  # re-run, not copied: documented in PythonSession.fork
        assert _session(sibling).fork_exact is False and _session(sibling).forked_by == "replay"
        sibling.close()
    finally:
        env.close()


@cow
def test_a_fork_copies_the_live_process_not_its_history(env):
    # randomness, object ids and a counter of how often each call ran: a re-run would change all three
    env.step(_code("import os, random\ntoken = os.urandom(8).hex()\nobj = object()\nr = random.random()\n"
                   "open('runs.txt', 'a').write('x')\nprint(token, id(obj), r)"))
    parent = _out(env)
    (sibling,) = env.fork()
    assert _session(sibling).forked_by == "copy" and _session(sibling).fork_exact is True
    sibling.step(_code("print(token, id(obj), r)\nprint(open('runs.txt').read(), os.getpid(), os.getcwd())"))
    assert _out(sibling) == parent + "x 1 /scratch\n"
    (grandchild,) = sibling.fork()
    grandchild.step(_code("print(random.random() == random.random(), open('runs.txt').read())"))
    env.step(_code("print(random.random() == random.random(), open('runs.txt').read())"))
    assert _out(grandchild) == _out(env) == "False x\n"
    for e in (sibling, grandchild):
        e.close()


@cow
def test_scratch_files_are_copied_as_they_are_and_links_are_not_followed(env):
    env.step(_code("import os\nos.makedirs('d/e')\nopen('d/e/data.bin', 'wb').write(bytes(range(256)) * 4000)\n"
                   "os.chmod('d/e/data.bin', 0o640)\nos.symlink('/etc/hostname', 'host_link')\n"
                   "os.symlink('../..', 'd/e/up')\nos.mkfifo('fifo')\nos.utime('d/e/data.bin', (1, 2))"))
    (sibling,) = env.fork()
    probe = ("import os, stat, hashlib\nst = os.stat('d/e/data.bin')\n"
             "print(hashlib.sha256(open('d/e/data.bin', 'rb').read()).hexdigest()[:12], oct(st.st_mode & 0o777), "
             "st.st_mtime, os.readlink('host_link'), os.readlink('d/e/up'), stat.S_ISFIFO(os.lstat('fifo').st_mode))")
    env.step(_code(probe))
    sibling.step(_code(probe))
    assert _out(sibling) == _out(env) and "0o640 2.0 /etc/hostname ../.. True" in _out(env), _out(sibling)
    sibling.close()


@cow
def test_a_siblings_crash_or_timeout_leaves_the_parent_and_the_others_working():
    env = _env(timeout_s=3)
    try:
        env.step(_code("kept = 'state'"))
        crasher, looper, fine = env.fork(3)
        crasher.step(_code("import os\nos._exit(3)"))
        # the copy's exit code is read from its zombie: root may; an unprivileged host is told it cannot be read
        want = "exited with code 3" if os.geteuid() == 0 else "how cannot be read here"
        assert "crashed" in _out(crasher) and want in _out(crasher), _out(crasher)
        looper.step(_code("while True:\n    pass"))
        assert "longer than the 3 s limit" in _out(looper)
        for e in (env, fine):
            e.step(_code("print(kept)"))
            assert _out(e) == "state\n"
        for e in (crasher, looper):  # a fresh interpreter after the restart
            e.step(_code("print('kept' in globals())"))
            assert _out(e) == "False\n"
    finally:
        for e in (crasher, looper, fine, env):
            e.close()


@cow
def test_a_parent_that_times_out_keeps_its_forks_alive():
    env = _env(timeout_s=3)
    try:
        env.step(_code("kept = 41"))
        (sibling,) = env.fork()
        env.step(_code("while True:\n    pass"))  # the parent is stopped, not killed: its fork lives in its namespace
        sibling.step(_code("print(kept + 1)"))
        assert _out(sibling) == "42\n"
        env.step(_code("print('kept' in globals())"))
        assert _out(env) == "False\n"
    finally:
        env.close()
        sibling.close()


@cow
def test_a_repl_running_threads_is_forked_by_replay_or_refused():
    env = _env(timeout_s=20)
    strict = _env(timeout_s=20, fork="copy")
    try:
        code = _code("import threading, time\nstop = threading.Event()\nt = threading.Thread(target=stop.wait)\n"
                     "t.start()\nvalue = 7")
        env.step(code)
        (sibling,) = env.fork()
        assert _session(sibling).forked_by == "replay"  # only one thread would be copied: not a copy
        sibling.step(_code("stop.set()\nprint(value)"))
        assert _out(sibling) == "7\n"
        sibling.close()
        strict.step(code)
        with pytest.raises(ForkError, match="threads"):
            strict.fork()
        strict.step(_code("stop.set()\nt.join()\nprint(value)"))  # the refused fork changed nothing
        assert _out(strict) == "7\n"
        (copy,) = strict.fork()  # one thread again: copied
        assert _session(copy).forked_by == "copy"
        copy.close()
    finally:
        env.close()
        strict.close()


@cow
def test_the_family_gives_its_sandbox_back_when_its_last_repl_ends():
    tool = PythonTool(min_idle=0, timeout_s=20)
    env, env2 = (LLMChatEnv(prompts=["Use Python."], tools=[tool], max_turns=12) for _ in range(2))
    env.reset(seed=0)
    env2.reset(seed=0)  # keeps the tool's pool open
    env.step(_code("x = 1"))
    a, b = env.fork(2)
    (c,) = a.fork()
    pool = tool.pool
    for e in (env, a, b):
        e.close()
        assert pool.idle == 0  # c still holds the family's sandbox
    c.step(_code("print(x)"))
    assert _out(c) == "1\n"
    c.close()
    assert pool.idle == 1  # back, and reusable: a fresh episode sees nothing of the family
    env2.step(_code("import os\nprint('x' in globals(), os.listdir('.'))"))
    assert _out(env2) == "False []\n"
    env2.close()


_REACH_OUT = """
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
delivered = []
for sig in (signal.SIGSTOP, signal.SIGKILL):
    for pid in [0, -1, *range(2, 200), *(-p for p in range(2, 40))]:
        try:
            os.kill(pid, sig)
            delivered.append(pid)
        except OSError:
            pass
caps = (ctypes.c_uint32 * 6)()
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
libc.capget(ctypes.byref(Header(0x20080522, 0)), caps)
calls = [libc.setresuid(0, 0, 0), libc.unshare(0x10000000), libc.mount(b"t", b"/scratch", b"tmpfs", 0, None),
         libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0),  # clone into a new user namespace
         libc.setpriority(2, os.getuid(), 19), libc.setpriority(0, 2, 19), libc.getsid(2), libc.getpgid(3)]
print(os.getpid(), delivered, list(caps), calls, sorted(os.listdir('/proc')))
"""


@cow
def test_a_copy_is_confined_like_its_parent_and_reaches_no_relative(env):
    env.step(_code("kept = 'parent state'"))
    a, b = env.fork(2)
    for prober in (a, env):  # a copy, then the parent itself, try to reach every other process
        prober.step(_code(_REACH_OUT))
        assert _out(prober) == "1 [] [0, 0, 0, 0, 0, 0] [-1, -1, -1, -1, -1, -1, -1, -1] []\n", _out(prober)
    status = open(f"/proc/{_session(a)._channel.pid}/status").read()
    assert "\nCapBnd:\t0000000000000000\n" in status and "\nNoNewPrivs:\t1\n" in status, status
    for e in (env, a, b):
        e.step(_code("print(kept)"))
        assert _out(e) == "parent state\n"
    a.close()
    b.close()


@cow
def test_descriptors_the_code_keeps_open_are_closed_in_a_copy(env):
    env.step(_code("f = open('log.txt', 'w')\nf.write('parent')\nf.flush()"))
    (sibling,) = env.fork()
    sibling.step(_code("try:\n    f.write('x'); f.flush()\nexcept OSError as e:\n    print(type(e).__name__, e.errno)\n"
                       "print(open('log.txt').read())"))
    assert _out(sibling) == "OSError 9\nparent\n"  # EBADF: not the parent's file, which the copy must not write
    env.step(_code("f.write(' more'); f.close(); print(open('log.txt').read())"))
    assert _out(env) == "parent more\n"
    sibling.close()


_SPIN_ON_A_GATED_CALL = r"""
import sys, ctypes, mmap, struct, signal
traps, results = [], []
signal.signal(signal.SIGTRAP, lambda *a: traps.append(1))
page = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                 prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
header = ctypes.create_string_buffer(struct.pack("<Ii", 0x20080522, 0))
data = ctypes.create_string_buffer(24)
# machine code: capset(header, data) (empty sets) up to 2 million times while it fails with ENOSYS; returns the last rax
page.write(b"\x49\xB9" + struct.pack("<Q", 2_000_000) + b"\xB8\x7E\x00\x00\x00" + b"\x48\xBF"
           + struct.pack("<Q", ctypes.addressof(header)) + b"\x48\xBE" + struct.pack("<Q", ctypes.addressof(data))
           + b"\x0F\x05" + b"\x48\x83\xF8\xDA" + b"\x75\x05" + b"\x49\xFF\xC9" + b"\x75\xDA" + b"\xC3")
spin = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
def hook(frame, event, arg):  # runs in the REPL's serve loop, after the reply: while the host forks it
    if event == "call" and frame.f_code.co_name == "recv_fds":
        sys.setprofile(None)
        results.extend(spin() for _ in range(3))
sys.setprofile(hook)
"""


@cow
def test_the_repls_own_gated_calls_fail_even_while_the_host_attaches_to_fork_it(env):
    """Code left running between calls (a profiling hook) spins on a call only the host's tracer may make while the
    host stops the REPL to fork it: the call must keep failing (ENOSYS), and no stray signal may reach the REPL."""
    env.step(_code(_SPIN_ON_A_GATED_CALL))
    for _ in range(4):
        (sibling,) = env.fork()
        assert _session(sibling).forked_by == "copy"
        sibling.close()
        env.step(_code("print(set(results), traps)\nresults.clear()\nsys.setprofile(hook)"))
        assert _out(env) == "{-38} []\n", _out(env)


@cow
def test_closed_forks_are_reaped_and_a_parent_kept_for_its_forks_is_stopped():
    env = _env(timeout_s=20, max_threads=8)  # RLIMIT_NPROC 8 on a root host: unreaped copies would use it up
    try:
        env.step(_code("import threading\nkept = 1"))
        for _ in range(12):
            (sibling,) = env.fork()
            assert _session(sibling).forked_by == "copy"
            sibling.close()
        env.step(_code("t = threading.Thread(target=print)\nt.start()\nt.join()\nprint(kept)"))
        assert _out(env) == "\n1\n"
        (sibling,) = env.fork()
        parent = pidfd_pid(_session(env)._channel.pidfd)
        env.close()  # kept for its fork, and stopped: code it left running can do nothing more
        for _ in range(200):  # SIGSTOP takes effect when the process next runs
            state = open(f"/proc/{parent}/stat").read().rsplit(")", 1)[1].split()[0]
            if state == "T":
                break
            time.sleep(0.01)
        assert state == "T", state
        sibling.step(_code("print(kept + 1)"))
        assert _out(sibling) == "2\n"
        sibling.close()
    finally:
        env.close()
