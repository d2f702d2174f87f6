"""Forking an episode of a Python-tool env: the sibling's REPL holds the parent's variables, imports and files, and
each sibling is as isolated from the others as two episodes are (tested both ways, as root here and as an
unprivileged user in tests/tools/test_sandbox_unprivileged.py)."""

from __future__ import annotations

import pytest

from gym_llm.envs.chat import LLMChatEnv
from gym_llm.tools import PythonTool


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


def test_code_that_reads_randomness_makes_the_fork_inexact_and_says_so(env):
    env.step(_code("import os\ntoken = os.urandom(8).hex()\nprint(token)"))
    parent_token = _out(env).strip()
    (sibling,) = env.fork()
    sibling.step(_code("print(token)"))
    assert _out(sibling).strip() != parent_token  # re-run, not copied: documented in PythonSession.fork
    assert _session(sibling).fork_exact is False
    sibling.close()
