"""What runs inside the two sandboxes of one ``LLMCode-v0`` grading: the program's server and the grader.

Not imported by gym_llm: :mod:`gym_llm.envs.code_grader` compiles this file's source after ``mlgym_bridge.py``'s
(whose plain-data encoding, frames and ``Reader`` it uses) and runs the code object in two fresh REPLs, each in a
sandbox of its own (standard library only):

* the **program's sandbox** runs :func:`serve_program`: it loads the model's program (after the task's own prompt
  code, for its helpers and imports) and answers the grader's requests — ``load``, ``call`` (call the entry point
  with these arguments) or ``stdio`` (run the program on this stdin) — with plain data;
* the **grader's sandbox** runs :func:`grade`: the task's tests, reference solution and comparison. The tests call
  the program through a proxy function whose every call crosses two FIFOs to the program's sandbox and back, under a
  deadline. It prints one JSON line: the per-test results.

What the program returns arrives in the grader as a *copy made of plain data* (``mlgym_bridge.decode``: None, bool,
int, float, str, bytes, list, tuple, dict, set, ...): a returned object cannot pass by overriding ``__eq__``, patching
``assert`` or builtins only changes the program's own process, an exception the program raises is re-raised in the
grader as the builtin of the same name (an ``except ValueError`` in a test works) and cannot swallow the test's, and
the program never sees the tests, the reference or the expected values.
"""

import ast
import builtins
import copy
import errno
import io
import math
import os
import random
import select
import signal
import sys
import threading
import time
import traceback
import _thread

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


# ----------------------------------------------------------------------------------------------- the program's side
class _Out(io.TextIOBase):
    """A program's stdout when it runs on a test's stdin: keeps the first ``limit`` characters, counts the rest;
    ``.buffer`` takes bytes (``sys.stdout.buffer.write``)."""

    def __init__(self, limit):
        self.limit, self.parts, self.kept, self.total = limit, [], 0, 0
        self.buffer = _BytesOut(self)

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.total += len(text)
        room = self.limit - self.kept
        if room > 0:
            self.parts.append(text[:room])
            self.kept += min(room, len(text))
        return len(text)

    def writable(self):
        return True

    def text(self):
        return "".join(self.parts)


class _BytesOut:
    def __init__(self, out):
        self.out = out

    def write(self, data):
        return self.out.write(bytes(data).decode("utf-8", "replace"))

    def flush(self):
        pass


def _program_traceback(exc, limit):
    """The exception as the program would see it: the frames of its own code only (``<solution>``)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename not in ("<solution>", "<prompt>"):
        tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:
        text = type(exc).__name__
    return text if len(text) <= limit else "[... traceback head truncated ...]\n" + text[-limit:]


def _exit(code=None):
    raise SystemExit(code)


def serve_program(call_path, reply_path, program, setup, entry_point, stdio, max_output_chars, seed):
    """Answer the grader's requests until it closes the channel. ``program``: the model's source; ``setup``: the
    task's own prompt code run first in the same namespace (its helpers and imports; "" for none); ``stdio``: the
    program is a whole program run once per test on that test's stdin, else ``entry_point`` is a function."""
    loads, dumps, unmarshal, send = json.loads, json.dumps, marshal.loads, write_frame  # bound before the program runs
    random.seed(seed)
    sys.stdin = io.StringIO("")
    reader = Reader(os.open(call_path, os.O_RDONLY))
    reply_fd = os.open(reply_path, os.O_WRONLY)
    namespace = None
    compiled = None
    while True:
        try:
            kind, payload = reader.frame()
        except EOFError:
            return
        message = unmarshal(payload) if kind == KIND_MARSHAL else loads(payload)
        reply = {"id": message.get("id"), "ok": True, "value": None}
        try:
            op = message["op"]
            if op == "load":
                compiled = compile(program, "<solution>", "exec", dont_inherit=True)
                if not stdio:
                    namespace = {"__name__": "solution", "__builtins__": builtins, "exit": _exit, "quit": _exit}
                    if setup:
                        exec(compile(setup, "<prompt>", "exec", dont_inherit=True), namespace)
                    exec(compiled, namespace)
                    function = namespace.get(entry_point)
                    if not callable(function):
                        raise NameError(f"the program defines no function {entry_point!r}"
                                        + ("" if function is None else f" ({entry_point} is a {type(function).__name__})"))
            elif op == "call":
                args = message["args"] if kind == KIND_MARSHAL else decode(message["args"])
                kwargs = message["kwargs"] if kind == KIND_MARSHAL else decode(message["kwargs"])
                reply["value"] = encode(namespace[entry_point](*args, **kwargs))
            elif op == "stdio":
                reply["value"] = _run_program_on(compiled, message["input"], max_output_chars)
            else:
                raise ValueError(f"unknown op {op!r}")
            payload = dumps(reply).encode()
        except BaseException as e:  # SystemExit too: a function that exits has failed its call
            try:
                error = _program_traceback(e, FIRST_MESSAGE_CHARS)
                name = type(e).__name__
            except BaseException:
                error, name = "the program's exception could not be formatted", "Exception"
            payload = dumps({"id": message.get("id"), "ok": False, "type": str(name), "error": str(error)}).encode()
        send(reply_fd, KIND_JSON, payload)


def _run_program_on(compiled, stdin_text, max_output_chars):
    """Run the whole program once with ``stdin_text`` on its stdin; its stdout (stderr is not part of the answer)."""
    out, err = _Out(max_output_chars), _Out(0)
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin_text.encode("utf-8")), encoding="utf-8")
    sys.stdout, sys.stderr = out, err
    status = 0
    try:
        exec(compiled, {"__name__": "__main__", "__builtins__": builtins, "exit": _exit, "quit": _exit})
    except SystemExit as e:  # exit() at the end of a program is how many judges' programs stop
        code = e.code
        status = 0 if code is None or code == 0 else (code if isinstance(code, int) else 1)
        if status:
            raise
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return {"stdout": out.text(), "omitted": out.total - out.kept}


# ----------------------------------------------------------------------------------------------- the grader's side
class ProgramTimeout(BaseException):
    """The program did not answer in time (a BaseException: a test's ``except Exception`` does not swallow it)."""


class ProgramGone(BaseException):
    """The program's process ended, broke the protocol, or timed out on an earlier call."""


class GradingTimeout(BaseException):
    """The grading's own budget ran out (the watchdog interrupted the tests)."""


class DatasetError(Exception):
    """The task's tests, reference or inputs failed on their own."""


class Channel:
    """The grader's end of the two FIFOs, with a deadline on every wait."""

    def __init__(self, call_path, reply_path, deadline):
        self.deadline = deadline
        self.reply_fd = os.open(reply_path, os.O_RDONLY | os.O_NONBLOCK)
        while True:  # ENXIO until the program's process opens the read end
            try:
                self.call_fd = os.open(call_path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as e:
                if e.errno != errno.ENXIO:
                    raise
                if time.monotonic() > deadline:
                    raise ProgramGone("the program's sandbox did not start in time") from None
                time.sleep(0.0005)
        self.buffer = bytearray()
        self.next_id = 0
        self.gone = None  # why the program can no longer be called
        self.calls = 0
        self.last_call = None  # (shown call, shown result) of the latest call

    def request(self, message):
        if self.gone is not None:
            raise ProgramGone(self.gone)
        self.next_id += 1
        message["id"] = self.next_id
        if _marshal_exact(message):
            payload, kind = marshal.dumps(message), KIND_MARSHAL
        else:
            try:
                message = dict(message, args=encode(list(message.get("args", ()))),
                               kwargs=encode(message.get("kwargs", {})))
            except TypeError as e:
                raise DatasetError(f"a test passes the program a value that cannot cross to its sandbox: {e}") from None
            payload, kind = json.dumps(message).encode(), KIND_JSON
        try:
            self._write(struct.pack(">IB", len(payload), kind) + payload)
            frame = self._frame()
        except ProgramTimeout as e:
            self.gone = f"not run: the program did not answer an earlier call in time ({e})"
            raise
        except ProgramGone as e:
            self.gone = f"not run: the program had stopped ({e})"
            raise
        try:
            reply = json.loads(frame)
        except (ValueError, RecursionError) as e:
            self.gone = "not run: the program broke the protocol earlier"
            raise ProgramGone(f"the program sent a malformed reply ({type(e).__name__})") from None
        if type(reply) is not dict or reply.get("id") != self.next_id or type(reply.get("ok")) is not bool:
            self.gone = "not run: the program broke the protocol earlier"
            raise ProgramGone("the program sent a malformed reply")
        return reply

    def _write(self, data):
        view = memoryview(data)
        while view:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise ProgramTimeout("it stopped reading")
            if _ready(self.call_fd, select.POLLOUT, remaining):
                try:
                    view = view[os.write(self.call_fd, view):]
                except BrokenPipeError:
                    raise ProgramGone("its process ended") from None

    def _frame(self):
        buffer = self.buffer
        while True:
            if len(buffer) >= 5:
                size, kind = struct.unpack(">IB", buffer[:5])
                if size > MAX_REPLY_BYTES or kind != KIND_JSON:
                    raise ProgramGone(f"it sent a {size}-byte reply (the limit is {MAX_REPLY_BYTES})"
                                      if kind == KIND_JSON else "it sent a reply that is not JSON")
                if len(buffer) >= 5 + size:
                    payload = bytes(buffer[5:5 + size])
                    del buffer[:5 + size]
                    return payload
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise ProgramTimeout("the time limit ran out")
            if not _ready(self.reply_fd, select.POLLIN, remaining):
                continue
            try:
                chunk = os.read(self.reply_fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                raise ProgramGone("its process ended (it exited, crashed or was killed)")
            buffer += chunk

    def close(self):
        for fd in (getattr(self, "call_fd", None), self.reply_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _ready(fd, event, timeout_s):
    """``poll`` for one descriptor (``select()`` refuses descriptors >= 1024)."""
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(max(0, int(timeout_s * 1000 + 0.999))))


def _raised(reply):
    """The exception the program raised, as the grader raises it: the builtin of that name (else RuntimeError)."""
    name = reply.get("type")
    error = str(reply.get("error", ""))
    kind = getattr(builtins, name) if type(name) is str and name in _RAISED else RuntimeError
    shown = _cut(name, 80) if type(name) is str else "an exception"
    try:
        exc = kind(f"{shown} raised in the program")
    except Exception:  # a builtin whose constructor wants more (UnicodeDecodeError, ExceptionGroup, ...)
        exc = RuntimeError(f"{shown} raised in the program")
    exc.program_traceback = error
    return exc


def _value(reply):
    try:
        return decode(reply.get("value"))
    except (ValueError, TypeError, RecursionError) as e:
        raise ProgramGone(f"the program returned a value that is not plain data ({e})") from None


def program_function(channel, name):
    """The stand-in for the program's function in the tests: each call runs in the program's sandbox."""

    def call(*args, **kwargs):
        shown = f"{name}({', '.join([_show(a) for a in args] + [f'{k}={_show(v)}' for k, v in kwargs.items()])})"
        channel.calls += 1
        channel.last_call = (_cut(shown, 2 * VALUE_CHARS), None)
        reply = channel.request({"op": "call", "args": args, "kwargs": kwargs})
        if not reply["ok"]:
            exc = _raised(reply)
            channel.last_call = (channel.last_call[0], "raised " + _cut(exc.program_traceback.strip().splitlines()[-1]
                                                                       if exc.program_traceback.strip() else "", 300))
            raise exc
        value = _value(reply)
        channel.last_call = (channel.last_call[0], "returned " + _show(value))
        return value

    call.__name__ = call.__qualname__ = name
    return call


class Watchdog:
    """Interrupts the grader's main thread when the grading's budget runs out (``setitimer`` and ``alarm`` are not
    allowed in the sandbox): a thread raises :class:`GradingTimeout` there through a simulated SIGINT."""

    def __init__(self, deadline):
        self.fired = False
        self.done = threading.Event()
        signal.signal(signal.SIGINT, self._handler)
        self.thread = threading.Thread(target=self._run, args=(deadline,), daemon=True)
        self.thread.start()

    def _handler(self, signum, frame):
        if self.fired and not self.done.is_set():
            raise GradingTimeout("the time limit ran out")

    def _run(self, deadline):
        if not self.done.wait(max(0.0, deadline - time.monotonic())):
            self.fired = True
            _thread.interrupt_main(signal.SIGINT)

    def stop(self):
        self.done.set()


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
