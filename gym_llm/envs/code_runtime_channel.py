"""The grader's end of the call channel of an ``LLMCode-v0`` grading (see :mod:`gym_llm.envs.code_runtime`): the two
FIFOs to the program's sandbox under a deadline, the proxy function the tests call, and the watchdog that ends the
tests when the grading's budget runs out.

Not imported by gym_llm: :mod:`gym_llm.envs.code_grader` compiles this file's source into one module with
``mlgym/bridge.py``'s, ``code_runtime.py``'s and ``code_runtime_program.py``'s, so it uses their names (``send``,
``Reader``, ``_cut``, ...) without importing them. Standard library only.
"""

import builtins
import errno
import os
import select
import signal
import threading
import time
import _thread


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

