"""Waits on pipes work for any descriptor number (``gym_llm/core/fdwait.py``).

A trainer with an in-process vLLM engine and two vector envs of 64 ``LLMCode-v0`` sub-envs (two sandboxed REPLs
each) holds more than 1,024 descriptors; ``select.select`` refuses any descriptor >= 1024, and a SmolLM2 code run
stopped on "filedescriptor out of range in select()" in its first GRPO step. Here each test first pushes the
process's descriptors past 1,100, so every pipe the code under test opens is numbered above 1024, then runs it.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from gym_llm.core.fdwait import wait_fd

HIGH = 1100


@pytest.fixture
def many_fds():
    """Descriptors 3..HIGH taken (copies of /dev/null), so whatever opens next gets a number above 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < HIGH + 200:
        pytest.fail(f"RLIMIT_NOFILE hard limit {hard} < {HIGH + 200}: the test cannot place descriptors above 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 200) if soft != resource.RLIM_INFINITY else soft,
                                                hard))
    null = os.open(os.devnull, os.O_RDONLY)
    taken = [null]
    while taken[-1] < HIGH:
        taken.append(os.dup(null))
    yield
    for fd in taken:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_wait_fd_on_descriptors_above_1024(many_fds):
    r, w = os.pipe()
    try:
        assert r > 1024 and w > 1024
        assert not wait_fd(r, timeout_s=0.01)
        assert wait_fd(w, write=True, timeout_s=0.01)
        os.write(w, b"x")
        assert wait_fd(r, timeout_s=1.0)
        os.close(w)
        w = -1
        assert os.read(r, 1) == b"x" and wait_fd(r, timeout_s=1.0) and os.read(r, 1) == b""  # hang-up counts
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)


def test_the_python_sandbox_and_a_code_grading_run_with_high_descriptors():
    """In a fresh interpreter (the sandbox pools of this test process may hold low descriptors already)."""
    script = f"""
import os, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096) if hard != resource.RLIM_INFINITY else 4096, hard))
null = os.open(os.devnull, os.O_RDONLY)
taken = [null]
while taken[-1] < {HIGH}:
    taken.append(os.dup(null))
import gymnasium as gym, gym_llm
from gym_llm.tools import PythonTool
from gym_llm.tools.base import ToolCall
from gym_llm.rewards.deadline import call_with_deadline
r, w = os.pipe(); assert r > 1024; os.close(r); os.close(w)
tool = PythonTool(min_idle=1)
tool.attach()
out = tool.open_session().run(ToolCall("python", {{"code": "print(6 * 7)"}}))
assert "42" in str(out), out
tool.detach()
env = gym.make("LLMCode-v0", source="basic", split="test", size=2)
env.reset(options={{"task_id": 0}})
solution = env.unwrapped.parts.tasks[0].data["solution"]
_, reward, *_ , info = env.step(solution)
assert reward == 1.0, info
env.close()
assert call_with_deadline("operator:add", 2, 3, timeout_s=60) == 5
print("OK")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "OK" in done.stdout, (done.stdout[-2000:], done.stderr[-3000:])
