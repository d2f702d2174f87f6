"""The program's side of an ``LLMCode-v0`` grading (see :mod:`gym_llm.envs.code_runtime`): it loads the model's
program and answers the grader's ``load``, ``call`` and ``stdio`` requests with plain data.

Not imported by gym_llm: :mod:`gym_llm.envs.code_grader` compiles this file's source into one module with
``mlgym/bridge.py``'s, ``code_runtime.py``'s and ``code_runtime_channel.py``'s, so it uses their names (``send``,
``Reader``, ``_cut``, ...) without importing them. Standard library only.
"""

import builtins
import io
import os
import random
import sys
import traceback


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

