"""What runs inside the two sandboxes of one ``LLMCode-v0`` grading: the program's server and the grader.

Not imported by gym_llm: :mod:`gym_llm.envs.code_grader` compiles this file's source after ``mlgym/bridge.py``'s
(whose plain-data encoding, frames and ``Reader`` it uses) and before its two parts' (``code_runtime_program.py``:
the program's side; ``code_runtime_channel.py``: the grader's channel to it), as one module, and runs the code object
in two fresh REPLs, each in a sandbox of its own (standard library only):

* the **program's sandbox** runs :func:`serve_program`: it loads the model's program (after the task's own prompt
  code, for its helpers and imports) and answers the grader's requests — ``load``, ``call`` (call the entry point
  with these arguments) or ``stdio`` (run the program on this stdin) — with plain data;
* the **grader's sandbox** runs :func:`grade`: the task's tests, reference solution and comparison. The tests call
  the program through a proxy function whose every call crosses two FIFOs to the program's sandbox and back, under a
  deadline. It prints one JSON line: the per-test results.

What the program returns arrives in the grader as a *copy made of plain data* (``mlgym/bridge.py``'s ``decode``: None, bool,
int, float, str, bytes, list, tuple, dict, set, ...): a returned object cannot pass by overriding ``__eq__``, patching
``assert`` or builtins only changes the program's own process, an exception the program raises is re-raised in the
grader as the builtin of the same name (an ``except ValueError`` in a test works) and cannot swallow the test's, and
the program never sees the tests, the reference or the expected values.
"""

import ast
import builtins
import copy
import math
import random
import sys
import time

MAX_REPLY_BYTES = 1 << 24  # a reply larger than this (16 MiB) is refused: the program's call fails
FIRST_MESSAGE_CHARS = 2000  # the first failure's message (the feedback) is cut to this; the others to
OTHER_MESSAGE_CHARS = 240
VALUE_CHARS = 200  # a value shown in a message (repr) is cut to this
_RAISED = frozenset(n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
                    and issubclass(getattr(builtins, n), Exception)) - {"StopIteration", "StopAsyncIteration"}


def _cut(text, limit):
    text = str(text)
    return text if len(text) <= limit else text[:limit - 20] + " [... truncated ...]"


def _show(value):
    try:
        return _cut(repr(value), VALUE_CHARS)
    except BaseException:
        return f"<a {type(value).__name__}>"


class Results:
    """The per-test results of one grading."""

    def __init__(self, channel):
        self.channel = channel
        self.tests = []  # {"name", "passed", "message", "timed_out"}
        self.dataset_error = None
        self.load_error = None
        self.load_timed_out = False

    def add(self, name, passed, message="", timed_out=False):
        limit = FIRST_MESSAGE_CHARS if not passed and not any(not t["passed"] for t in self.tests) else OTHER_MESSAGE_CHARS
        self.tests.append({"name": name, "passed": bool(passed), "message": _cut(message, limit) if message else "",
                           "timed_out": bool(timed_out)})

    def failure(self, exc, source):
        """``(message, timed_out)`` for a test that raised ``exc``; the source of the failing statement first."""
        where = _cut(source.strip(), 300) if source else ""
        last = self.channel.last_call if self.channel is not None else None
        call = f"; {last[0]} {last[1]}" if last is not None and last[1] else ""
        if isinstance(exc, (ProgramTimeout, GradingTimeout)):
            call = f"; {last[0]} did not return in time" if last is not None and last[1] is None else ""
            return f"timed out: {exc}{call}" + (f"\n  in: {where}" if where else ""), True
        if isinstance(exc, ProgramGone):
            return str(exc) + (f"\n  in: {where}" if where else ""), False
        program_tb = getattr(exc, "program_traceback", None)
        if program_tb is not None:
            return f"{where}\n{last[0] if last else 'the program'} raised:\n{program_tb.rstrip()}", False
        if isinstance(exc, AssertionError):
            detail = f": {_show(exc.args[0])}" if exc.args else ""
            return f"failed: {where}{detail}{call}", False
        return f"{type(exc).__name__}: {_cut(exc, 300)} in: {where}{call}", False

    def as_json(self):
        return {"tests": self.tests, "dataset_error": self.dataset_error, "load_error": self.load_error,
                "load_timed_out": self.load_timed_out, "calls": self.channel.calls if self.channel is not None else 0}


def _units(statements, candidate):
    """Which of ``statements`` are tests: those holding an ``assert`` or naming the program's function."""
    out = []
    for stmt in statements:
        nodes = list(ast.walk(stmt))
        is_test = any(isinstance(n, ast.Assert) for n in nodes) or any(
            isinstance(n, ast.Name) and n.id == candidate for n in nodes)
        out.append(is_test)
    return out


def _wrapped(statements, record):
    """Each statement inside ``try: <stmt> except BaseException as e: record(i, e) else: record(i, None)``."""
    body = []
    for i, stmt in enumerate(statements):
        call = lambda arg: ast.Expr(ast.Call(ast.Name(record, ast.Load()), [ast.Constant(i), arg], []))
        handler = ast.ExceptHandler(ast.Name("BaseException", ast.Load()), "_gym_llm_e",
                                    [call(ast.Name("_gym_llm_e", ast.Load()))])
        body.append(ast.Try([stmt], [handler], [call(ast.Constant(None))], []))
    return body


def _run_assert_tests(spec, channel, results):
    """HumanEval-style ``check(candidate)`` or top-level statements (MBPP-style) calling the entry point by name."""
    source, entry_point = spec["tests"], spec["entry_point"]
    try:
        tree = ast.parse(source, "<tests>")
    except SyntaxError as e:
        raise DatasetError(f"the task's tests do not compile: {type(e).__name__}: {e}") from None
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    namespace = {"__name__": "__grader__", "__builtins__": builtins}
    if spec.get("setup"):
        try:
            exec(compile(spec["setup"], "<prompt>", "exec", dont_inherit=True), namespace)
        except BaseException as e:
            raise DatasetError(f"the task's prompt code fails on its own: {type(e).__name__}: {e}") from None
    if check is not None:
        candidate = check.args.args[0].arg if check.args.args else "candidate"
        statements = check.body
        check.body = _wrapped(statements, "_gym_llm_record")
    else:
        candidate = entry_point
        statements = tree.body
        tree.body = _wrapped(statements, "_gym_llm_record")
    is_test = _units(statements, candidate)
    lines = source.splitlines()

    def record(i, exc):
        stmt = statements[i]
        text = "\n".join(lines[stmt.lineno - 1:stmt.end_lineno])
        name = f"line {stmt.lineno}: " + _cut(text.strip().splitlines()[0] if text.strip() else "", 80)
        if exc is None:
            if is_test[i]:
                results.add(name, True)
            return
        from_program = isinstance(exc, (ProgramTimeout, ProgramGone)) or hasattr(exc, "program_traceback")
        if channel.calls == 0 and not from_program:  # nothing the program did can have caused it
            raise DatasetError(f"the task's test fails before the program is ever called ({name}): "
                               f"{type(exc).__name__}: {_cut(exc, 300)}")
        message, timed_out = results.failure(exc, text)
        results.add(name, False, message, timed_out)
        if isinstance(exc, GradingTimeout):
            raise exc

    namespace["_gym_llm_record"] = record
    # the entry point's name is the program's function in the tests too, as in HumanEval's own harness (where the
    # program is defined in the tests' module): HumanEval/33's check calls sort_third(...) by name
    namespace[entry_point] = program = program_function(channel, entry_point)
    code = compile(ast.fix_missing_locations(tree), "<tests>", "exec", dont_inherit=True)
    try:
        exec(code, namespace)
    except (DatasetError, GradingTimeout):
        raise
    except BaseException as e:
        raise DatasetError(f"the task's tests fail on their own: {type(e).__name__}: {_cut(e, 300)}") from None
    if check is not None:
        namespace["check"](program)
    if not results.tests:
        raise DatasetError("the task's tests hold no test (no assert, no call of the program)")


def same_value(got, expected, rel_tol=1e-6, abs_tol=1e-9):
    """The differential tests' comparison of plain data (see docs/code.md): equal types up to these rules —
    tuples and lists are both sequences; ints and floats compare as numbers (floats within ``rel_tol``/``abs_tol``,
    NaN equals NaN), bools only equal bools; dicts need the same keys; sets compare as sets; strings exactly."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        if isinstance(expected, int) and isinstance(got, int):
            return got == expected
        if math.isnan(expected) or math.isnan(got):
            return math.isnan(expected) and math.isnan(got)
        return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(expected) and all(same_value(g, e, rel_tol, abs_tol) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(same_value(got[k], expected[k], rel_tol, abs_tol) for k in expected)
    if isinstance(expected, (set, frozenset)) and isinstance(got, (set, frozenset)):
        return got == expected
    return type(got) is type(expected) and got == expected


def _plain(value):
    """``value`` as plain data (numpy values as Python's; raises TypeError for anything else)."""
    return decode(encode(value))


def _run_differential(spec, channel, results):
    """CodeI/O: inputs from the task's generator under a fixed seed, the reference's output compared with the
    program's (:func:`same_value`). A case where the reference itself raises is left out."""
    reference = {"__name__": "__reference__", "__builtins__": builtins}
    generator = {"__name__": "__generator__", "__builtins__": builtins, "Random": random.Random}
    try:
        exec(compile(spec["reference"], "<reference>", "exec", dont_inherit=True), reference)
        exec(compile(spec["generator"], "<generator>", "exec", dont_inherit=True), generator)
    except BaseException as e:
        raise DatasetError(f"the task's reference or input generator fails on its own: {type(e).__name__}: {e}") \
            from None
    make = generator.get("generate_inputs") or generator.get("generate_input")
    solve = reference.get(spec["entry_point"])
    if not callable(make) or not callable(solve):
        raise DatasetError("the task has no input generator or no reference function")
    program = program_function(channel, spec["entry_point"])
    rng = random.Random(spec["seed"])
    for case in range(spec["num_cases"]):
        try:
            inputs = make(rng)
            if type(inputs) is not dict or not all(type(k) is str for k in inputs):
                raise TypeError(f"the generator made a {type(inputs).__name__}, not a dict of arguments")
            random.seed(spec["seed"] + case)
            expected = _plain(solve(**copy.deepcopy(inputs)))
        except GradingTimeout:
            raise
        except BaseException:
            continue  # the reference refuses this input: not a test
        name = f"case {case}: " + _cut(", ".join(f"{k}={_show(v)}" for k, v in inputs.items()), 120)
        try:
            got = program(**inputs)
        except GradingTimeout:
            raise
        except BaseException as e:
            results.add(name, False, *results.failure(e, ""))
            continue
        if same_value(got, expected):
            results.add(name, True)
        else:
            results.add(name, False, f"wrong output for {name[name.index(':') + 2:]}: expected {_show(expected)}, "
                                     f"got {_show(got)}")
    if not results.tests:
        raise DatasetError("the reference solution refused every generated input")


def normalized_output(text):
    """Stdout as judges compare it: trailing whitespace of each line and trailing blank lines dropped."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _run_stdio_tests(spec, channel, results):
    for case, (stdin_text, expected) in enumerate(zip(spec["inputs"], spec["outputs"])):
        name = f"case {case}: stdin " + _show(stdin_text)[:60]
        channel.last_call = (f"the program on stdin {_show(stdin_text)}", None)
        channel.calls += 1
        try:
            reply = channel.request({"op": "stdio", "input": stdin_text})
            if not reply["ok"]:
                raise _raised(reply)
            out = _value(reply)
            if type(out) is not dict or type(out.get("stdout")) is not str:
                raise ProgramGone("the program sent a malformed reply")
        except GradingTimeout:
            raise
        except BaseException as e:
            results.add(name, False, *results.failure(e, ""))
            continue
        if out.get("omitted"):
            results.add(name, False, f"output limit exceeded on {name}: more than {spec['max_output_chars']} "
                                     "characters")
        elif normalized_output(out["stdout"]) == normalized_output(expected):
            results.add(name, True)
        else:
            results.add(name, False, f"wrong output on stdin {_show(stdin_text)}: expected {_show(expected)}, "
                                     f"got {_show(out['stdout'])}")


_KINDS = {"asserts": _run_assert_tests, "differential": _run_differential, "stdio": _run_stdio_tests}


def grade(spec):
    """Grade one program (``spec``: the task's tests and the channel's paths); print one JSON line of results."""
    started = time.monotonic()
    deadline = started + spec["budget_s"]
    marks = {}
    random.seed(spec.get("seed", 0))
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = _Out(10_000)  # what the tests print is not the result
    channel = results = watchdog = None
    try:
        try:
            channel = Channel(spec["call"], spec["reply"], deadline)
            marks["connected_s"] = time.monotonic() - started
            results = Results(channel)
            watchdog = Watchdog(deadline + spec.get("grace_s", 1.0))  # after the calls' own deadline
            reply = channel.request({"op": "load"})
            if not reply["ok"]:
                results.load_error = _cut(str(reply.get("error", "")), FIRST_MESSAGE_CHARS)
            marks["loaded_s"] = time.monotonic() - started
        except (ProgramTimeout, ProgramGone, GradingTimeout) as e:
            results = results or Results(channel)
            results.load_error = f"the program did not load: {e}"
            results.load_timed_out = not isinstance(e, ProgramGone)
        if results.load_error is None:
            try:
                _KINDS[spec["kind"]](spec, channel, results)
            except DatasetError as e:
                results.dataset_error = str(e)
            except GradingTimeout as e:
                results.add("(the rest of the tests)", False, f"timed out: {e}", True)
    finally:
        if watchdog is not None:
            watchdog.stop()
        if channel is not None:
            channel.close()
        sys.stdout, sys.stderr = saved
    marks["graded_s"] = time.monotonic() - started
    print(json.dumps(dict(results.as_json(), marks=marks)))
