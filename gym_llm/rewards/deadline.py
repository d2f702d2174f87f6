"""Calls with a hard deadline that holds in any thread: the call runs in a worker process that is killed past it.

A thread cannot be stopped from outside, and ``signal.alarm`` (math-verify's own timeout) works only in the main
thread, so a verifier that loops forever on a 14-character answer (``#### 9^{9^{9}}`` through sympy) would hang the
vector env's grading thread — and whatever lock it holds. Here the call is sent to a **worker process**; past the
deadline the worker is ``SIGKILL``\\ ed (the caller gets :class:`DeadlineExceeded` at once, holding nothing) and a
fresh worker is started for the next call.

* Workers are plain ``python -c`` subprocesses (not ``multiprocessing``: its ``spawn`` re-imports the user's
  ``__main__``, its ``fork`` copies a multi-threaded process). They get this process's ``sys.path`` and import the
  function by name, so the function must be importable (``"package.module:function"``); arguments and results are
  pickled.
* A pool keeps idle workers warm (the first call of a worker pays its start and imports, outside the deadline);
  each call takes one, so concurrent callers never wait on each other. The pool's lock is held only to take or
  return a worker, never during a call.
* After ``fork`` (``AsyncVectorEnv`` workers) a child never uses its parent's workers: it starts its own.

Used by :mod:`gym_llm.rewards.gsm8k` for math-verify, by IFEval scoring, and by every env for the user's
``reward_fn`` (:class:`IsolatedHook`: the function is sent by value, so lambdas and closures work; the env's
``reward_timeout_s=None`` opts out); usable for any verifier (:func:`call_with_deadline`, :class:`with_deadline`).
"""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
import time
import weakref
from typing import Any

from gym_llm.core.fdwait import wait_fd
from gym_llm.core.forksafe import ForkSafeLock

__all__ = [
    "DEFAULT_HOOK_TIMEOUT_S", "DeadlineExceeded", "IsolatedHook", "WorkerPool", "call_with_deadline", "isolate_hook",
    "with_deadline",
]

_FRAME = struct.Struct(">I")
_MAX_FRAME = 64 << 20

_SERVE = r"""
import os, pickle, struct, sys
frame = struct.Struct(">I")
out = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)  # what the called code prints goes to stderr, never into the reply channel
inp = os.fdopen(0, "rb", buffering=0)
def read(n):
    data = b""
    while len(data) < n:
        chunk = inp.read(n - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data
def send(obj):
    payload = pickle.dumps(obj)
    out.write(frame.pack(len(payload)) + payload)
path, preload = pickle.loads(read(frame.unpack(read(4))[0]))
sys.path[:] = path
import importlib
for module in preload:
    importlib.import_module(module)
send(("ready", None))
functions = {}
shipped = {}  # functions sent by value (user hooks), newest last; the oldest go past 32
class Missing(Exception):
    pass
def resolve(target):
    if isinstance(target, tuple):  # ("shipped", key, pickled function or None when this worker has it)
        _, key, payload = target
        if payload is not None:
            shipped[key] = pickle.loads(payload)
            while len(shipped) > 32:
                del shipped[next(iter(shipped))]
        elif key not in shipped:
            raise Missing(key)  # evicted: the caller sends it again
        return shipped[key]
    if target not in functions:
        module, _, name = target.partition(":")
        value = importlib.import_module(module)
        for part in name.split("."):
            value = getattr(value, part)
        functions[target] = value
    return functions[target]
while True:
    target, args, kwargs = pickle.loads(read(frame.unpack(read(4))[0]))
    try:
        send(("ok", resolve(target)(*args, **kwargs)))
    except Missing:
        send(("missing", None))
    except BaseException as e:
        import traceback
        try:
            try:
                import cloudpickle as pickler  # the hook's own exception classes go back by value
            except ImportError:
                pickler = pickle
            exc = pickler.dumps(e)
            pickle.loads(exc)
        except Exception:
            exc = None
        try:
            send(("error", (type(e).__name__, str(e)[:2000], traceback.format_exc()[-4000:], exc)))
        except Exception:
            send(("error", ("Error", "unpicklable result", "", None)))
"""


class DeadlineExceeded(TimeoutError):
    """The call did not finish within its deadline; its worker was killed."""


class _Worker:
    def __init__(self, preload: tuple[str, ...], startup_timeout_s: float):
        self.process = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, close_fds=True)
        self.pid = os.getpid()
        self.known: set[str] = set()  # keys of the shipped functions this worker holds
        try:
            self._send((list(sys.path), tuple(preload)))
            status, _ = self._receive(startup_timeout_s)
        except BaseException:
            self.kill()
            raise
        if status != "ready":
            self.kill()
            raise RuntimeError("A deadline worker did not start.")

    def _send(self, obj: Any) -> None:
        payload = pickle.dumps(obj)
        self.process.stdin.write(_FRAME.pack(len(payload)) + payload)
        self.process.stdin.flush()

    def _receive(self, timeout_s: float) -> tuple[str, Any]:
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        data = b""
        need = _FRAME.size
        header_done = False
        while True:
            while len(data) < need:
                left = deadline - time.monotonic()
                if left <= 0 or not wait_fd(fd, timeout_s=left):
                    raise DeadlineExceeded(f"no answer within {timeout_s:g} s")
                chunk = os.read(fd, need - len(data))
                if not chunk:
                    raise RuntimeError(f"The deadline worker died (exit status {self.process.poll()}).")
                data += chunk
            if header_done:
                return pickle.loads(data)
            need = _FRAME.unpack(data)[0]
            if need > _MAX_FRAME:
                raise RuntimeError(f"The deadline worker sent a {need}-byte reply (limit {_MAX_FRAME}).")
            data, header_done = b"", True

    def call(self, target: str, args: tuple, kwargs: dict, timeout_s: float) -> tuple[str, Any]:
        self._send((target, args, kwargs))
        return self._receive(timeout_s)

    def kill(self) -> None:
        try:
            self.process.kill()
        except OSError:
            pass
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class WorkerPool:
    """Warm worker processes for deadline calls (see the module docstring).

    Args:
        preload: modules each worker imports when it starts (before any deadline runs), e.g. ``("math_verify",)``.
        max_idle: idle workers kept; more are started when more callers run at once, and stopped when returned
            past this many.
        startup_timeout_s: how long a worker may take to start and import ``preload``.
    """

    def __init__(self, preload: tuple[str, ...] = (), *, max_idle: int = 4, startup_timeout_s: float = 120.0):
        self.preload = tuple(preload)
        self.max_idle = int(max_idle)
        self.startup_timeout_s = float(startup_timeout_s)
        self.killed = 0  # workers killed at a deadline
        self._idle: list[_Worker] = []
        self._lock = ForkSafeLock()
        self._pid = os.getpid()
        _LIVE_POOLS.add(self)

    def call(self, target: str, *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """``target(*args, **kwargs)`` (``"module:function"``) in a worker; :class:`DeadlineExceeded` past
        ``timeout_s`` seconds (the worker is killed), ``RuntimeError`` naming the exception if it raised."""
        status, value = self._exchange(lambda worker: worker.call(target, args, kwargs, timeout_s), target, timeout_s)
        if status == "error":
            name, message = value[:2]
            raise RuntimeError(f"{target} raised {name}: {message}")
        return value

    def call_shipped(self, hook: "IsolatedHook", args: tuple) -> Any:
        """``hook.fn(*args)`` in a worker, the function sent by value the first time a worker runs it.

        Past ``hook.timeout_s`` the worker is killed and :class:`DeadlineExceeded` raised. An exception the hook
        raises is re-raised here as itself (with the worker's traceback as a note) when it pickles, else as
        ``RuntimeError`` naming it."""

        def run(worker: _Worker) -> tuple[str, Any]:
            payload = None if hook.key in worker.known else hook.payload
            reply = worker.call(("shipped", hook.key, payload), args, {}, hook.timeout_s)
            if reply[0] == "missing":  # the worker dropped it (it keeps the 32 newest): send it again
                reply = worker.call(("shipped", hook.key, hook.payload), args, {}, hook.timeout_s)
            worker.known.add(hook.key)
            return reply

        status, value = self._exchange(run, f"{hook.name} {hook.label}", hook.timeout_s)
        if status == "error":
            name, message, trace, exc = value
            if exc is not None:
                try:
                    error = pickle.loads(exc)
                except Exception:
                    error = None
                if isinstance(error, BaseException):
                    error.add_note(f"(raised by {hook.name} in its deadline worker process)\n{trace.rstrip()}")
                    raise error
            raise RuntimeError(f"{hook.name} {hook.label} raised {name}: {message}\n{trace.rstrip()}")
        return value

    def _exchange(self, run: Any, what: str, timeout_s: float) -> tuple[str, Any]:
        """``run(worker)`` on a worker taken from the pool; the worker goes back only if it answered. Past the
        deadline (or on any other failure) it is killed, so a late reply never reaches the next caller."""
        worker = self._take()
        try:
            reply = run(worker)
        except BaseException as e:
            worker.kill()
            if isinstance(e, DeadlineExceeded):
                self.killed += 1
                raise DeadlineExceeded(f"{what} did not finish within {timeout_s:g} s; its worker process was "
                                       "killed") from None
            raise
        self._give_back(worker)
        return reply

    def warm(self, count: int = 1) -> None:
        """Start ``count`` idle workers now (e.g. before timing starts)."""
        workers = [self._take() for _ in range(count)]
        for worker in workers:
            self._give_back(worker)

    def _take(self) -> _Worker:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's workers are not ours
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                worker = self._idle.pop()
                if worker.process.poll() is None:
                    return worker
                worker.kill()
        return _Worker(self.preload, self.startup_timeout_s)

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if worker.pid == os.getpid() and len(self._idle) < self.max_idle:
                self._idle.append(worker)
                return
        worker.kill()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        if self._pid == os.getpid():
            for worker in idle:
                worker.kill()


_LIVE_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    """Stop every pool's idle workers when the interpreter exits (they would also exit on their closed stdin, but
    after this process: an orphan for a moment, and a ResourceWarning per worker)."""
    for pool in list(_LIVE_POOLS):
        pool.close()


_DEFAULT_POOL: WorkerPool | None = None
_DEFAULT_LOCK = ForkSafeLock()


def _default_pool() -> WorkerPool:
    global _DEFAULT_POOL
    with _DEFAULT_LOCK:
        if _DEFAULT_POOL is None:
            # what every hook's arguments need (tasks, messages, arrays) is imported when a worker starts, outside
            # any deadline: a fresh worker after a kill must not spend its caller's deadline on imports
            _DEFAULT_POOL = WorkerPool(preload=("numpy", "cloudpickle", "gym_llm.core.tasks", "gym_llm.core.messages"))
    return _DEFAULT_POOL


def call_with_deadline(target: str, *args: Any, timeout_s: float, **kwargs: Any) -> Any:
    """``target(*args, **kwargs)`` in a shared :class:`WorkerPool`, killed past ``timeout_s``."""
    return _default_pool().call(target, *args, timeout_s=timeout_s, **kwargs)


class with_deadline:  # noqa: N801  (used like a function: reward_fn=with_deadline(my_reward, 5.0))
    """``fn`` wrapped to run in a deadline worker: a reward hook that can never hang a step.

    ``fn`` must be importable by name (a module-level function, not a lambda, a closure or a function defined in
    ``__main__``): the worker imports it. Its arguments and result are pickled. Past ``timeout_s`` the call raises
    :class:`DeadlineExceeded`, which the envs turn into reward 0 with ``info["reward_error"]`` (fail closed).

    Example::

        env = gym.make("LLMChat-v0", reward_fn=with_deadline(my_package.rewards.judge, timeout_s=5.0))
    """

    def __init__(self, fn: Any, timeout_s: float):
        module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
        if not callable(fn) or module is None or module == "__main__" or "<" in qualname:
            raise ValueError(
                f"with_deadline needs a function importable by name, got {fn!r} (module {module!r}). Lambdas, closures "
                "and functions defined in __main__ cannot be imported by the worker process: move the function into a "
                "module on sys.path."
            )
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}.")
        self.target, self.timeout_s = f"{module}:{qualname}", float(timeout_s)
        self.__name__ = getattr(fn, "__name__", "reward")

    def __call__(self, *args: Any) -> Any:
        return call_with_deadline(self.target, *args, timeout_s=self.timeout_s)

    def __repr__(self) -> str:
        return f"with_deadline({self.target}, timeout_s={self.timeout_s:g})"


DEFAULT_HOOK_TIMEOUT_S = 30.0
"""The deadline every env gives a user-supplied reward hook unless told otherwise (``reward_timeout_s=``)."""


class IsolatedHook:
    """A user's reward hook that runs in a deadline worker process: what every env does with ``reward_fn``.

    The function is pickled **by value** with ``cloudpickle`` (lambdas, closures, callable objects and functions
    defined in ``__main__`` or a notebook all work), sent once to each worker that runs it, and called there with
    pickled arguments; its result is pickled back. Past ``timeout_s`` the worker is killed and the call raises
    :class:`DeadlineExceeded` (the envs turn it into reward 0 with ``info["reward_error"]``); nothing in the env's
    process waits on a lock the hook holds.

    What this changes for a hook, compared with calling it in the env's thread:

    * **State it mutates stays in the worker.** A hook that appends to a captured list or bumps a counter does so in
      the worker's copy (and a killed worker's copy is lost). Keep state out of reward hooks, or pass
      ``reward_timeout_s=None`` to the env to call the hook in its own thread, without a deadline.
    * **Captured objects are copied** into each worker (a few at a time, started as needed): a hook holding a large
      model is better written to load it lazily, inside the function, once per worker.
    * **The per-call cost** is a pipe round-trip plus pickling the arguments: 0.1–0.3 ms (see ``docs/verifiers.md``).

    A hook that cannot be pickled at all (it holds a lock, a socket, an open file) is refused when the env is
    built, with the fix. Raises from the hook come back as the same exception, its worker traceback in a note.

    Args:
        fn: the hook.
        timeout_s: its deadline, seconds.
        name: what to call it in errors (``"reward_fn"``).
    """

    def __init__(self, fn: Any, timeout_s: float, name: str = "reward_fn"):
        import uuid

        if not callable(fn):
            raise TypeError(f"{name} must be callable, got {type(fn).__name__}.")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"reward_timeout_s must be a number of seconds > 0 (or None to run {name} in the env's "
                             f"thread without a deadline), got {timeout_s!r}.")
        self.fn, self.timeout_s, self.name = fn, float(timeout_s), name
        self.label = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        self.key = uuid.uuid4().hex
        try:
            import cloudpickle
        except ImportError:  # pragma: no cover  (a core dependency)
            cloudpickle = pickle
        try:
            self.payload = cloudpickle.dumps(fn)
        except Exception as e:
            raise TypeError(
                f"{name} ({self.label}) must be sent to a worker process, which runs it under a deadline of "
                f"{self.timeout_s:g} s, but it cannot be pickled: {type(e).__name__}: {e}. Fix: build what it holds "
                "(a client, a lock, an open file) inside the function instead of capturing it, or pass "
                f"reward_timeout_s=None to call {name} in the env's own thread, without a deadline."
            ) from None

    def __call__(self, *args: Any) -> Any:
        return _default_pool().call_shipped(self, args)

    def __reduce__(self) -> tuple:  # pickles as its arguments (the copy gets a fresh key and payload)
        return IsolatedHook, (self.fn, self.timeout_s, self.name)

    def __repr__(self) -> str:
        return f"IsolatedHook({self.label}, timeout_s={self.timeout_s:g})"


def isolate_hook(fn: Any, timeout_s: float | None, *, name: str = "reward_fn") -> Any:
    """What an env calls for a user hook ``fn``: ``None`` stays ``None``; ``timeout_s=None`` keeps ``fn`` as it is
    (called in the env's thread, no deadline: the documented opt-out); a hook already under a deadline
    (:class:`with_deadline`, :class:`IsolatedHook`) or one that keeps its own (``keeps_own_deadline = True``: an
    :class:`~gym_llm.rewards.judge.LLMJudge`, whose cache and call counts must live in the env's process) is kept;
    anything else becomes an :class:`IsolatedHook`."""
    if fn is None or timeout_s is None or isinstance(fn, (with_deadline, IsolatedHook)) \
            or getattr(fn, "keeps_own_deadline", False) is True:
        return fn
    return IsolatedHook(fn, timeout_s, name=name)
