"""The host side of ``LLMCode-v0``'s grading: the program in one sandbox, the tests in another, plain data between.

One grading (:meth:`CodeSandboxes.grade`) takes a fresh REPL from each of two pools of warm sandboxes (the
project's bubblewrap + seccomp + rlimits/cgroups sandbox, ``gym_llm.tools.sandbox``):

* the **program's REPL** (no subprocesses; nothing of the task bound) loads the model's program and serves calls;
* the **grader's REPL** runs the task's tests, reference solution and comparison (``code_runtime.grade``); each call
  of the program's function crosses two FIFOs to the program's REPL and back, as plain data.

The FIFOs are made per grading under a random 128-bit name in a folder bound read-only into both pools and listable
by neither (mode ``0311``), as MLGym's submission bridge does (``mlgym/workspace.py``). Nothing else is shared: the
program never sees the tests, cannot touch the grader's process, and what it prints is not read. Both REPLs end with
the grading; their sandboxes go back to the pools (the program's is killed instead when it did not stop in time).
Why this design, what it costs and what it rules out: docs/code.md.
"""

from __future__ import annotations

import base64
import json
import logging
import marshal
import os
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping

from gym_llm.core.forksafe import ForkSafeLock
from gym_llm.core.load import load_scaled
from gym_llm.tools.sandbox.config import SandboxConfig
from gym_llm.tools.sandbox.pool import SandboxPool
from gym_llm.tools.sandbox.process import ReplReply, Sandbox, SandboxError, _sandbox_path, find_bwrap

__all__ = ["CodeSandboxes", "GradeReport", "Grading", "TestResult", "DEFAULT_TIMEOUT_S"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
"""Wall-clock budget of one grading (the program's loading and every test together), stretched by the load."""

_SOURCES = (Path(__file__).parent / "mlgym" / "bridge.py",
            *(Path(__file__).with_name(name) for name in ("code_runtime.py", "code_runtime_program.py",
                                                          "code_runtime_channel.py")))
_BOOT_LOCK = ForkSafeLock()
_BOOT: str | None = None
_BACKSTOP_S = 15.0  # beyond the budget: how long the host waits for a grader that does not finish by itself (x load)
_PROGRAM_STOP_S = 1.0  # after the grader is done: how long the program's REPL may take to return from serving


def _boot() -> str:
    """The REPL code that loads the runtime (the bridge's encoding + code_runtime) into a module of its own, so the
    program's names cannot shadow it: a marshalled code object (compiled once per process; ~4x faster to load than
    the source). Both REPLs run the host's own interpreter, so the marshal format matches."""
    global _BOOT
    with _BOOT_LOCK:
        if _BOOT is None:
            source = "\n\n".join(path.read_text(encoding="utf-8") for path in _SOURCES)
            code = base64.b64encode(marshal.dumps(compile(source, "<gym_llm code runtime>", "exec"))).decode()
            _BOOT = ("import marshal as _m, base64 as _b, types as _t\n"
                     "_gym_llm_code = _t.ModuleType('_gym_llm_code')\n"
                     f"exec(_m.loads(_b.b64decode('{code}')), _gym_llm_code.__dict__)\n"
                     "del _m, _b, _t\n")
        return _BOOT


@dataclass(frozen=True)
class TestResult:
    """One test of one grading.

    Attributes:
        name: where the test is (``"line 12: assert candidate(3) == 4"``, ``"case 2: x=5"``).
        passed: it passed.
        message: why it failed (the failing statement, what the program returned or raised; truncated).
        timed_out: it failed because the time ran out.
    """

    name: str
    passed: bool
    message: str = ""
    timed_out: bool = False


@dataclass(frozen=True)
class GradeReport:
    """What grading one program found.

    Attributes:
        tests: every test's result (empty when the program did not load or the dataset failed).
        load_error: the program did not load (a syntax error, an exception at import, no such function, it exited).
        dataset_error: the task's own tests, reference or inputs fail without the program's help: not the model's
            failure (``info["reward_error"]``).
        output_chars: what the program printed while graded (function tasks: not part of the answer); None when its
            REPL had to be killed.
        duration_s: wall time of the grading.
        timed_out: a test (or the whole grading) ran out of time.
    """

    tests: tuple[TestResult, ...] = ()
    load_error: str | None = None
    dataset_error: str | None = None
    output_chars: int | None = None
    duration_s: float = 0.0
    timed_out: bool = False

    @property
    def num_passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def passed(self) -> bool:
        """Every test passed (and there was at least one)."""
        return bool(self.tests) and self.load_error is None and self.dataset_error is None and \
            all(t.passed for t in self.tests)

    @property
    def fraction(self) -> float:
        """Tests passed / tests (0.0 when none ran)."""
        if self.load_error is not None or self.dataset_error is not None or not self.tests:
            return 0.0
        return self.num_passed / len(self.tests)

    @property
    def first_failure(self) -> str:
        """Why the program failed, for the model: the load error, else the first failing test's message."""
        if self.dataset_error is not None:
            return self.dataset_error
        if self.load_error is not None:
            return self.load_error
        return next((f"{t.message}" for t in self.tests if not t.passed), "")


@dataclass(frozen=True, kw_only=True)
class Grading:
    """How to grade one program: what :func:`code_runtime.grade` gets, less the channel.

    Attributes:
        kind: ``"asserts"`` (a ``check(candidate)`` function or top-level asserts calling ``entry_point``),
            ``"differential"`` (the reference's outputs on generated inputs) or ``"stdio"`` (stdin/stdout pairs).
        program: the model's program.
        entry_point: the function the tests call (asserts, differential).
        setup: the task's own prompt code, run before the program and before the tests (helpers, imports).
        tests: asserts: the test source.
        reference / generator / seed / num_cases: differential: the reference source, the input generator's source,
            its seed and how many inputs.
        inputs / outputs: stdio: the test cases.
    """

    kind: Literal["asserts", "differential", "stdio"]
    program: str
    entry_point: str = ""
    setup: str = ""
    tests: str = ""
    reference: str = ""
    generator: str = ""
    seed: int = 0
    num_cases: int = 0
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


class CodeSandboxes:
    """The two pools of one env (the program's and the grader's), started on first use.

    Args:
        timeout_s: budget of one grading (wall clock, stretched by the machine's load).
        sandbox: settings of the program's sandbox (any :class:`SandboxConfig` field but ``extra_ro_paths`` and
            ``allow_subprocess``: its memory, CPU, files, ...); the grader's gets the same limits.
        max_output_chars: the most a program may print: on one test's stdout (stdio tasks: more fails the test), and
            in all while graded (more fails the program: output limit exceeded).
    """

    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S, sandbox: Mapping[str, Any] | None = None,
                 max_output_chars: int = 1 << 20):
        settings = dict(sandbox or {})
        for name in ("extra_ro_paths", "allow_subprocess", "symlinks"):
            if name in settings:
                raise ValueError(f"sandbox={{{name!r}: ...}} is not a setting of LLMCode-v0's sandbox: the program's "
                                 "sandbox binds nothing of the task and starts no processes.")
        try:
            SandboxConfig(**settings)
        except TypeError as e:
            raise TypeError(f"sandbox= takes SandboxConfig's settings: {e}") from None
        self.settings = settings
        self.timeout_s = float(timeout_s)
        self.max_output_chars = int(max_output_chars)
        self._lock = threading.Lock()
        self._pools: tuple[SandboxPool, SandboxPool] | None = None
        self._folder: Path | None = None
        self._owner = os.getpid()
        self._closed = False
        self._prewarm = 0

    # ---------------------------------------------------------------------------------------------- pools
    def _configs(self, channels: str) -> tuple[SandboxConfig, SandboxConfig]:
        common = {"timeout_s": self.timeout_s + _BACKSTOP_S, **self.settings}
        isolation = common.get("isolation", "bwrap")
        program = SandboxConfig(**{**common, "max_output_chars": 1_000, "extra_ro_paths": (channels,)})
        grader = SandboxConfig(**{**common, "max_output_chars": 4_000_000, "max_error_chars": 8_000,
                                  "extra_ro_paths": (channels,), "isolation": isolation})
        return program, grader

    def _ensure(self) -> tuple[SandboxPool, SandboxPool, Path]:
        if self._owner != os.getpid():  # a forked child (AsyncVectorEnv worker): pools of its own
            self._owner, self._pools, self._folder = os.getpid(), None, None
            self._lock = threading.Lock()
        with self._lock:
            if self._closed:
                raise SandboxError("the env was closed")
            if self._pools is None:
                folder = Path(tempfile.mkdtemp(prefix="gym_llm_code_"))
                channels = folder / "channels"
                channels.mkdir(mode=0o700)
                channels.chmod(0o311)  # the sandboxes may open a FIFO they are told of, and list nothing
                folder.chmod(0o711)
                program, grader = self._configs(str(channels))
                bwrap = find_bwrap() if program.isolation == "bwrap" else None
                pools = (SandboxPool(program, min_idle=1, bwrap=bwrap), SandboxPool(grader, min_idle=1, bwrap=bwrap))
                if self._prewarm:
                    for pool in pools:
                        pool.prewarm(self._prewarm)
                self._pools, self._folder = pools, folder
            return self._pools[0], self._pools[1], self._folder / "channels"

    def prewarm(self, count: int) -> None:
        """Keep ``count`` sandboxes of each kind ready (the vector env: one per sub-env), once the pools start."""
        self._prewarm = max(self._prewarm, int(count))
        if self._pools is not None:
            for pool in self._pools:
                pool.prewarm(count)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools, folder = self._pools, self._folder
            self._pools = self._folder = None
        if pools is not None and self._owner == os.getpid():
            for pool in pools:
                pool.close()
        if folder is not None and self._owner == os.getpid():
            (folder / "channels").chmod(0o700)
            shutil.rmtree(folder, ignore_errors=True)

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "timeout_s": self.timeout_s, "max_output_chars": self.max_output_chars}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(timeout_s=state["timeout_s"], sandbox=state["settings"],
                      max_output_chars=state["max_output_chars"])

    # ---------------------------------------------------------------------------------------------- grading
    def grade(self, grading: Grading) -> GradeReport:
        """Grade ``grading.program`` (see the module docstring). Never raises for anything the program does.

        Raises:
            SandboxError: a sandbox could not start or failed on its own (a problem of this host, never a score).
        """
        program_pool, grader_pool, channels = self._ensure()
        start = time.perf_counter()
        budget_s = load_scaled(self.timeout_s)
        token = secrets.token_hex(16)
        call, reply = channels / f"{token}.call", channels / f"{token}.reply"
        for fifo in (call, reply):
            os.mkfifo(fifo)
            os.chmod(fifo, 0o666)  # root hosts: each sandbox's REPL runs as a uid of its own
        program_box: Sandbox | None = None
        grader_box: Sandbox | None = None
        program_repl = grader_repl = None
        served: dict[str, ReplReply] = {}
        thread: threading.Thread | None = None
        try:
            program_box = program_pool.acquire()
            program_repl = program_box.start_repl()
            grader_box = grader_pool.acquire()
            grader_repl = grader_box.start_repl()
            serve = (_boot() + "_gym_llm_code.serve_program("
                     f"{_sandbox_path(str(call))!r}, {_sandbox_path(str(reply))!r}, {grading.program!r}, "
                     f"{grading.setup!r}, {grading.entry_point!r}, {grading.kind == 'stdio'}, "
                     f"{self.max_output_chars}, {grading.seed})\n")
            thread = threading.Thread(target=lambda: served.update(
                reply=program_repl.execute(serve, timeout_s=budget_s + load_scaled(_BACKSTOP_S))), daemon=True,
                name="gym_llm_code_program")
            thread.start()
            spec = {"kind": grading.kind, "call": _sandbox_path(str(call)), "reply": _sandbox_path(str(reply)),
                    "budget_s": budget_s, "entry_point": grading.entry_point, "setup": grading.setup,
                    "tests": grading.tests, "reference": grading.reference, "generator": grading.generator,
                    "seed": grading.seed, "num_cases": grading.num_cases, "inputs": list(grading.inputs),
                    "outputs": list(grading.outputs), "max_output_chars": self.max_output_chars,
                    "grace_s": load_scaled(1.0)}
            graded = grader_repl.execute(_boot() + f"_gym_llm_code.grade(__import__('json').loads({json.dumps(spec)!r}))\n",
                                         timeout_s=budget_s + load_scaled(_BACKSTOP_S))
            report = _report(graded, budget_s + load_scaled(_BACKSTOP_S))
        finally:
            if grader_box is not None:
                if grader_repl is not None:
                    grader_box.end_repl(grader_repl)
                grader_pool.release(grader_box, reusable=grader_box.alive)
            if program_box is not None:
                healthy = self._stop_program(thread, call, reply, program_box)
                if program_repl is not None and healthy:
                    program_box.end_repl(program_repl)
                program_pool.release(program_box, reusable=healthy and program_box.alive)
            for fifo in (call, reply):
                try:
                    os.unlink(fifo)
                except FileNotFoundError:
                    pass
        served_reply = served.get("reply")
        output = None if served_reply is None or served_reply.status not in ("ok", "error") else \
            len(served_reply.output) + served_reply.omitted_chars
        if output is not None and output > self.max_output_chars and report.dataset_error is None:
            report = replace(report, load_error=f"output limit exceeded: the program printed {output:,} characters "
                                                f"while graded (the limit is {self.max_output_chars:,})")
        return replace(report, output_chars=output, duration_s=time.perf_counter() - start)

    @staticmethod
    def _stop_program(thread: threading.Thread | None, call: Path, reply: Path, box: Sandbox) -> bool:
        """Let the program's REPL return from serving (the grader closed its ends: EOF), else kill its sandbox.
        Whether the sandbox may be reused."""
        if thread is None:
            return box.alive
        thread.join(load_scaled(_PROGRAM_STOP_S) / 2)
        if thread.is_alive():  # a program that never got its ends opened (the grader failed first)?
            _release_waiters(call, reply)
            thread.join(load_scaled(_PROGRAM_STOP_S) / 2)
        if not thread.is_alive():
            return True
        box.kill()  # still computing (it timed out) or stuck: its call ends with 'crashed'
        thread.join(10.0)
        return False


def _report(graded: ReplReply, backstop_s: float) -> GradeReport:
    """The grader REPL's reply as a report. The grader prints one JSON line; a grader that ran past the backstop or
    crashed (the program cannot reach its process, but a value it returned can make the tests' own code slow or
    large) is a failed grading with a ``dataset_error`` saying so, never an exception."""
    if graded.status == "timeout":
        return GradeReport(tests=(TestResult("(grading)", False, f"timed out: the tests did not finish within "
                                                                 f"{backstop_s:.0f} s", True),), timed_out=True)
    lines = [line for line in graded.output.splitlines() if line.startswith("{")]
    if graded.status != "ok" or not lines:
        logger.warning("LLMCode-v0's grader failed (%s): %s", graded.status, graded.error[-1500:])
        return GradeReport(dataset_error=f"the grader failed ({graded.status}): {graded.error[-500:]}")
    data = json.loads(lines[-1])
    tests = tuple(TestResult(t["name"], t["passed"], t["message"], t["timed_out"]) for t in data["tests"])
    load_error = data["load_error"]
    return GradeReport(tests=tests, load_error=load_error, dataset_error=data["dataset_error"],
                       timed_out=any(t.timed_out for t in tests) or bool(data["load_timed_out"]))


def _release_waiters(call: Path, reply: Path) -> None:
    """Open and close each FIFO's other end, so a process blocked opening it goes on (and then reads EOF)."""
    for path, flags in ((call, os.O_WRONLY | os.O_NONBLOCK), (reply, os.O_RDONLY | os.O_NONBLOCK)):
        try:
            os.close(os.open(path, flags))
        except OSError:  # ENXIO: nobody is reading the call FIFO
            pass
