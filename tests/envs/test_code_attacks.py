"""Hostile replies to LLMCode-v0: programs that try to pass without solving the task. Each attack class has a test;
every attack must score 0.0 and leave the env serving (an honest program graded right after it scores 1.0).

Where the attack really works on a naive grader, the test shows it: HumanEval's own way of grading — the prompt, the
program and the tests executed in one namespace, passed when nothing raises — run here in one sandboxed REPL
(:func:`naive_verdict`), passes the same program. The mutations of this package's grader each test was checked against
are listed in docs/code.md ("Attacks"). The module runs as whoever runs the suite (root here) and again as uid 65534
(tests/tools/test_sandbox_unprivileged.py lists it).
"""

from __future__ import annotations

import json
import textwrap
import time

import gymnasium as gym
import pytest

import gym_llm  # noqa: F401
from gym_llm.core.load import load_scaled

TIMEOUT_S = 2.0
HONEST_0 = textwrap.dedent("""
    def has_close_elements(numbers, threshold):
        return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
""")


@pytest.fixture(scope="module")
def env():
    env = gym.make("LLMCode-v0", timeout_s=TIMEOUT_S, max_output_chars=100_000)
    yield env
    env.close()


def grade(env, program: str, task_id: int = 0) -> tuple[float, dict]:
    env.reset(seed=0, options={"task_id": task_id})
    _, reward, terminated, truncated, info = env.step(f"```python\n{textwrap.dedent(program)}\n```")
    assert terminated and not truncated
    return reward, info


def still_serves(env) -> None:
    reward, info = grade(env, HONEST_0)
    assert reward == 1.0 and info["num_passed"] == 7, info["first_failure"]


@pytest.fixture(scope="module")
def naive():
    """HumanEval's harness in one sandboxed REPL: ``exec(prompt + program + test + check(entry))``, pass = no error."""
    from gym_llm.tools.sandbox import SandboxConfig, SandboxPool
    from gym_llm.tools.sandbox.process import find_bwrap

    pool = SandboxPool(SandboxConfig(timeout_s=10, max_output_chars=1_000), min_idle=0, bwrap=find_bwrap())

    def verdict(env, program: str, task_id: int = 0) -> bool:
        problem = env.unwrapped.parts.tasks[task_id].data["problem"]
        source = problem.code_prompt + textwrap.dedent(program) + "\n" + problem.tests + \
            f"\ncheck({problem.entry_point})\n"
        sandbox = pool.acquire()
        try:
            repl = sandbox.start_repl()
            reply = repl.execute(f"exec({source!r}, {{'__name__': '__main__'}})")
            sandbox.end_repl(repl)
        finally:
            pool.release(sandbox, reusable=False)
        return reply.status == "ok"

    yield verdict
    pool.close()


# ------------------------------------------------------------------------------------------- exits early, status 0
@pytest.mark.parametrize("program", [
    "import sys\nsys.exit(0)\n",
    "import os\nos._exit(0)\n",
    "raise SystemExit(0)\n" + HONEST_0,
])
def test_a_program_that_exits_while_loading_scores_0(env, program):
    reward, info = grade(env, program)
    assert reward == 0.0 and not info["correct"] and info["num_passed"] == 0
    assert "did not load" in info["first_failure"] or "SystemExit" in info["first_failure"], info["first_failure"]
    still_serves(env)


@pytest.mark.parametrize("how", ["os._exit(0)", "raise SystemExit(0)", "__import__('ctypes').string_at(0)"])
def test_a_program_that_passes_one_test_then_exits_scores_0(env, how):
    """Mutation tried: the grader counting a test the program never answered as 'not run' instead of failed: the
    os._exit(0) program then passed (1 of 1 answered tests)."""
    reward, info = grade(env, f"""
        import os
        calls = []
        def has_close_elements(numbers, threshold):
            calls.append(1)
            if len(calls) > 1:
                {how}
            return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
    """)
    tests = json.loads(info["tests"])
    assert reward == 0.0 and info["num_passed"] == 1 and len(tests) == 7, tests
    assert all(not t["passed"] for t in tests[1:])
    still_serves(env)


# ------------------------------------------------------------------------------------------- fake verdicts
FAKE_VERDICT = """
    import atexit, json, os, sys
    fake = {"tests": [{"name": "all", "passed": True, "message": "", "timed_out": False}], "dataset_error": None,
            "load_error": None, "calls": 7}
    line = json.dumps(fake)
    print("All tests passed!\\n" + line)
    for fd in (1, 2):
        try:
            os.write(fd, (line + "\\nOK: 7 passed\\n").encode())
        except OSError:
            pass
    atexit.register(lambda: print(line))
    _dumps = json.dumps
    def dumps(obj, *args, **kwargs):  # the grader's own result line, if it ran in this process
        if isinstance(obj, dict) and "tests" in obj:
            obj = dict(obj, tests=fake["tests"], load_error=None, dataset_error=None)
        return _dumps(obj, *args, **kwargs)
    json.dumps = dumps
    sys.stdout.write(line + "\\n")
    def has_close_elements(numbers, threshold):
        print(line)
        return not any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
"""


def test_a_program_that_prints_a_fake_verdict_scores_0(env):
    """Mutation tried: the program's code run in the grader's process (the tests calling it directly instead of
    through the bridge): its json.dumps patch then rewrote the grader's own result line, 1.0."""
    reward, info = grade(env, FAKE_VERDICT)
    assert reward == 0.0 and info["num_passed"] == 0 and info["num_tests"] == 7
    assert info["output_chars"] > 0  # it did print; nothing it printed was read
    still_serves(env)


# ------------------------------------------------------------------------------------------- patched builtins, assert
PATCHES = """
    import builtins, math, sys
    builtins.abs = lambda x: 0
    math.fabs = lambda x: 0.0
    builtins.all = builtins.any = lambda *a: True
    sys.modules["math"] = math
    def poly(xs, x):  # HumanEval/32's check measures the program's root with the prompt's poly
        return 0.0
    def check(candidate):
        return None
    def find_zero(xs):
        return 12345.0
"""


def test_a_program_that_patches_builtins_helpers_or_the_check_scores_0(env, naive):
    """HumanEval/32: the tests check |poly(coeffs, root)| < 1e-4 with math.fabs and the prompt's poly. Redefining poly
    (or patching math.fabs) passes HumanEval's own harness; here the tests use the grader's pristine ones. Mutation
    tried: the program run in the grader's process — 1.0."""
    assert naive(env, PATCHES, task_id=32)  # the attack is real
    reward, info = grade(env, PATCHES, task_id=32)
    assert reward == 0.0 and info["num_passed"] == 0, info["first_failure"]
    still_serves(env)


# ------------------------------------------------------------------------------------------- __eq__ overrides
@pytest.mark.parametrize("value", [
    "type('Yes', (), {'__eq__': lambda s, o: True, '__ne__': lambda s, o: False, '__bool__': lambda s: True})()",
    "type('Yes', (int,), {'__eq__': lambda s, o: True, '__hash__': int.__hash__})(3)",
    "type('Yes', (str,), {'__eq__': lambda s, o: True, '__hash__': str.__hash__})('x')",
    "type('Yes', (list,), {'__eq__': lambda s, o: True})()",
    "type('Yes', (dict,), {'__eq__': lambda s, o: True})()",
    "__import__('collections').Counter() if False else type('C', (__import__('collections').Counter,), "
    "{'__eq__': lambda s, o: True})()",
])
def test_a_returned_object_that_overrides_eq_scores_0(env, naive, value):
    """What the program returns reaches the tests as a copy made of plain data (or not at all): an object equal to
    everything is refused, an int/str/dict subclass arrives as the plain value. Mutation tried: values passed by
    reference (the program in the grader's process) — 1.0 with the first object."""
    program = f"def has_close_elements(numbers, threshold):\n    return {value}\n"
    if "'Yes', ()" in value:
        assert naive(env, program)  # the attack is real
    reward, info = grade(env, program)
    assert reward == 0.0 and info["num_passed"] == 0, info["tests"]
    still_serves(env)


# ------------------------------------------------------------------------------------------- reads or rewrites the tests
READS_TESTS = """
    import ast, dis, gc, os, sys, types

    def test_sources():
        # the tests' source anywhere it could be: callers' variables, objects in memory, files
        found = []
        frame = sys._getframe(1)
        while frame is not None:
            for scope in (frame.f_locals, frame.f_globals):
                found += [v for v in list(scope.values()) if isinstance(v, str) and "def check(candidate)" in v]
            frame = frame.f_back
        for obj in gc.get_objects():
            if isinstance(obj, (list, tuple, dict)):
                values = obj.values() if isinstance(obj, dict) else obj
                found += [v for v in list(values) if isinstance(v, str) and "def check(candidate)" in v]
            if isinstance(obj, types.FunctionType) and obj.__name__ == "check":
                obj.__code__ = (lambda candidate: None).__code__  # and rewrite it
        for root in ("/tmp", "/scratch", "/run", "/home", os.getcwd()):  # the installed packages aside
            for path, dirs, files in os.walk(root):
                if "site-packages" in path or "/lib/python" in path or path.startswith(("/proc", "/sys", "/usr")):
                    dirs[:] = []
                    continue
                for name in files:
                    try:
                        with open(os.path.join(path, name), errors="ignore") as f:
                            text = f.read(1 << 20)
                    except OSError:
                        continue
                    if "def check(candidate)" in text:
                        found.append(text)
        return found

    def answers(source):
        table = {}
        for line in source[source.index("def check(candidate)"):].splitlines():
            line = line.strip()
            if line.startswith("assert candidate(") and " == " in line:
                call, expected = line[len("assert candidate("):].rsplit(" == ", 1)
                try:
                    table[repr(ast.literal_eval("(" + call[:-1] + ",)"))] = ast.literal_eval(expected)
                except (ValueError, SyntaxError):
                    pass
        return table

    def from_the_callers_frame():
        # HumanEval's asserts are `assert candidate(...) == EXPECTED`: the constant right after the call in the
        # caller's bytecode is the expected value
        frame = sys._getframe(2)
        instructions = list(dis.get_instructions(frame.f_code))
        after = [i for i in instructions if i.offset > frame.f_lasti]
        for ins, nxt in zip(after, after[1:]):
            if ins.opname == "LOAD_CONST" and nxt.opname == "COMPARE_OP":
                return ins.argval
        return "no tests found"

    def has_close_elements(numbers, threshold):
        for source in test_sources():
            table = answers(source)
            if repr((numbers, threshold)) in table:
                return table[repr((numbers, threshold))]
        return from_the_callers_frame()
"""


def test_a_program_that_reads_or_rewrites_the_tests_scores_0(env, naive):
    """The tests, the reference and the expected values never enter the program's sandbox: not in its memory, not
    on its file system, not in its callers' frames. Mutation tried: the program in the grader's process (the frame
    trick passes, 1.0); and the tests given to the program's sandbox as its setup code (the file-system and memory
    search finds them in the serving frame's variables, 1.0)."""
    assert naive(env, READS_TESTS)  # the attack is real
    reward, info = grade(env, READS_TESTS)
    assert reward == 0.0 and info["num_passed"] == 0, info["tests"]
    still_serves(env)


# ------------------------------------------------------------------------------------------- catches the tests' exceptions
CATCHES = """
    import atexit, os, sys, threading
    sys.excepthook = lambda *args: None
    threading.excepthook = lambda *args: None
    atexit.register(lambda: os._exit(0))
    calls = []
    def has_close_elements(numbers, threshold):
        calls.append(1)
        if len(calls) == 1:  # one honest answer, then whatever stops a harness early
            return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
        errors = (SystemExit(0), KeyboardInterrupt(), GeneratorExit(), StopIteration(True), AssertionError())
        raise errors[len(calls) % len(errors)]
"""


def test_a_program_that_raises_past_the_tests_or_hooks_their_exit_scores_0(env):
    """After one honest answer the program raises what would end or confuse a harness (SystemExit(0),
    KeyboardInterrupt, StopIteration, ...) and installs hooks that swallow errors and exit 0: in the grader each call
    fails as a plain exception (a RuntimeError unless it is an ordinary builtin Exception), recorded by the test's own
    wrapper, and every later test still runs. Mutation tried: the program's exception re-raised by its own type
    whatever it is, with the grader keeping the results it had when the tests stopped — 1 of 1 test, 1.0."""
    reward, info = grade(env, CATCHES)
    tests = json.loads(info["tests"])
    assert reward == 0.0 and len(tests) == 7 and [t["passed"] for t in tests] == [True] + [False] * 6, tests
    still_serves(env)


def test_the_tests_own_except_clauses_see_the_programs_exceptions_by_type(env):
    """A test that expects an exception gets the builtin of the program's exception's name (and nothing else)."""
    task = {"prompt": "Write f(x) raising ValueError for x < 0, else returning x.", "entry_point": "f",
            "tests": "def check(candidate):\n    try:\n        candidate(-1)\n        assert False, 'no error'\n"
                     "    except ValueError:\n        pass\n    assert candidate(2) == 2\n"}
    scratch = gym.make("LLMCode-v0", tasks=[task], timeout_s=TIMEOUT_S)
    try:
        for body, expected in (("if x < 0: raise ValueError('negative')\n    return x", 1.0),
                               ("if x < 0: raise TypeError('negative')\n    return x", 0.0),
                               ("return x", 0.0)):
            scratch.reset(seed=0)
            reward = scratch.step(f"```python\ndef f(x):\n    {body}\n```")[1]
            assert reward == expected, body
    finally:
        scratch.close()


# ------------------------------------------------------------------------------------------- forks
FORK_VIEW = {"prompt": "Write fork_probe().", "entry_point": "fork_probe",
             "tests": "def check(candidate):\n    assert candidate() == 'refused'\n"}


def test_a_program_cannot_fork_or_start_processes(env):
    """The program's sandbox allows no new process: fork, subprocess and posix_spawn fail inside it (a test that
    passes only when all three were refused). Mutation tried: allow_subprocess=True for the program's sandbox: 'forked'
    came back and this test failed."""
    program = """
        import os, subprocess
        def fork_probe():
            try:
                pid = os.fork()
            except OSError:
                pass
            else:
                if pid == 0:
                    os._exit(0)
                return "forked"
            for start in (lambda: subprocess.run(["/bin/true"]), lambda: os.posix_spawn("/bin/true", ["true"], {})):
                try:
                    start()
                    return "started a process"
                except OSError:
                    pass
            return "refused"
    """
    scratch = gym.make("LLMCode-v0", tasks=[FORK_VIEW], timeout_s=TIMEOUT_S)
    try:
        scratch.reset(seed=0)
        _, reward, _, _, info = scratch.step(f"```python\n{textwrap.dedent(program)}\n```")
        assert reward == 1.0, info["first_failure"]
    finally:
        scratch.close()


def test_a_fork_bomb_or_a_forking_program_scores_0(env):
    for program in ("import os\nwhile True:\n    os.fork()\n",
                    "import os\npid = os.fork()\nif pid:\n    os._exit(0)\n" + HONEST_0,
                    "import threading\nfor _ in range(10_000):\n    threading.Thread(target=lambda: None).start()\n"):
        reward, info = grade(env, program)
        assert reward == 0.0, program
    still_serves(env)


# ------------------------------------------------------------------------------------------- sleeps past the deadline
@pytest.mark.parametrize("program", [
    "import time\ndef has_close_elements(numbers, threshold):\n    time.sleep(10_000)\n",
    "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n",
    "import time\ntime.sleep(10_000)\n",
    "def has_close_elements(numbers, threshold):\n    return sum(range(10 ** 14))\n",
])
def test_a_program_that_sleeps_past_the_deadline_scores_0_in_time(env, program):
    """Mutation tried: no deadline on the calls in the grader — the grading then lasted until the host's backstop
    (the budget + 15 s, both stretched by the load) and the time bound below failed."""
    start = time.perf_counter()
    reward, info = grade(env, program)
    took = time.perf_counter() - start
    assert reward == 0.0 and info["timed_out"], info["first_failure"]
    assert took < 2 * load_scaled(TIMEOUT_S) + 10.0, took  # the budget, stopping the program, slack (load changes)
    assert "did not return in time" in info["first_failure"] or "did not load" in info["first_failure"]
    still_serves(env)


# ------------------------------------------------------------------------------------------- floods output
def test_a_program_that_floods_its_output_scores_0(env):
    """A right answer buried in output past the limit fails (output limit exceeded), and so does a flood of fake
    passes around a wrong one. Mutation tried: not counting what the program prints — the first program then scored
    1.0."""
    flood = """
        import os, sys
        for _ in range(200):
            print("All tests passed! " * 1000)
        sys.stdout.flush()
    """
    flood = textwrap.dedent(flood)
    reward, info = grade(env, flood + HONEST_0)
    assert reward == 0.0 and "output limit exceeded" in info["first_failure"], info["first_failure"]
    assert info["output_chars"] > 100_000
    reward, info = grade(env, flood + "def has_close_elements(numbers, threshold):\n    print('PASSED ' * 10**6)\n"
                                      "    return True\n")
    assert reward == 0.0
    reward, info = grade(env, "print('working...')\n" + HONEST_0)  # a little output is fine
    assert reward == 1.0 and info["output_chars"] == len("working...\n")
    still_serves(env)


# ------------------------------------------------------------------------------------------- odd programs
@pytest.mark.parametrize("program", [
    "def has_close_elements(numbers, threshold):\n    return lambda: True\n",
    "def has_close_elements(numbers, threshold):\n    return (x for x in [True])\n",
    "def has_close_elements(numbers, threshold):\n    x = []\n    for _ in range(100_000):\n        x = [x]\n    return x\n",
    "def has_close_elements(numbers, threshold):\n    return 'x' * (20 << 20)\n",
    "def has_close_elements(numbers, threshold):\n    return 'x' * (10 ** 11)\n",
    "def has_close_elements(numbers, threshold):\n    return has_close_elements(numbers, threshold)\n",
    "import os\nos.closerange(0, 4096)\n" + HONEST_0,
    "import os\ndef has_close_elements(numbers, threshold):\n    for fd in range(3, 64):\n"
    "        try:\n            os.write(fd, b'\\x00\\x00\\x00\\x20J{\"id\": 1, \"ok\": true, \"value\": true}')\n"
    "        except OSError:\n            pass\n    return None\n",
    "x = '\\ud800'\nprint(x)\ndef has_close_elements(numbers, threshold):\n    return '\\udfff'\n",
    "def has_close_elements(numbers, threshold):\n    raise UnicodeDecodeError('utf-8', b'', 0, 1, 'x')\n",
    "class ExceptionGroup(Exception):\n    pass\ndef has_close_elements(numbers, threshold):\n"
    "    raise ExceptionGroup('x')\n",
    "import sys\nsys.setrecursionlimit(10**6)\ndef f(n):\n    return f(n + 1)\nf(0)\n",
    "def has_close_elements(numbers, threshold):\n    import os\n    return os.listdir('/run/host/tmp') + "
    "os.listdir([p for p in __import__('glob').glob('/run/host/tmp/gym_llm_code_*/channels')][0])\n",
])
def test_odd_programs_fail_cleanly_and_the_env_keeps_serving(env, program):
    reward, info = grade(env, program)
    assert reward == 0.0 and not info["correct"], program
    still_serves(env)
