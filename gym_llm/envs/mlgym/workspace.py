"""The agent's workspace and the grader, each in the project's own sandbox (bubblewrap + seccomp + rlimits/cgroups).

Two sandbox pools per env, with different read-only binds:

* **agent pool**: binds ``stage/public`` (starter files and the data without hidden files). Each episode gets one
  REPL whose private tmpfs scratch dir holds the workspace, seen at MLGym's path ``/home/agent/workspace``;
  commands run there, ``run``/``python`` as child processes with a per-command wall-clock timeout.
* **grading pool**: binds ``stage/private`` (pristine evaluation script and starter files, full data with labels),
  which the agent's sandbox never sees. Each evaluation gets a fresh REPL: the pristine workspace is rebuilt in its
  scratch dir, only the submission files are copied over from the agent's workspace (as bytes), and the task's
  evaluation script runs there. Nothing the agent wrote elsewhere (a patched evaluator, a ``json.py`` shadowing the
  stdlib, a fake score file) reaches it.
* **submission pool** (tasks whose submission is Python code the evaluation script imports: the games, 3SAT): binds
  ``stage/public`` like the agent's. The submitted code never runs in the grading sandbox: there, each submitted
  ``.py`` file is replaced by a proxy module, and every call crosses through two FIFOs in ``stage/channels`` (bound
  into both, listed by neither) to a fresh REPL of this pool that runs the agent's modules (see ``bridge.py``).
  So the code cannot patch the evaluator in memory, print a score line of its own, or touch the grader's files.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_llm.core.load import load_scaled
from gym_llm.tools.sandbox.config import SandboxConfig
from gym_llm.tools.sandbox.pool import SandboxPool
from gym_llm.tools.sandbox.process import ReplChannel, Sandbox, SandboxError, _sandbox_path

__all__ = ["SandboxREPL", "WorkspaceSession", "Evaluation", "SubmissionCode", "parse_metrics", "sandbox_configs",
           "WORKSPACE"]

logger = logging.getLogger(__name__)

WORKSPACE = "/home/agent/workspace"
_RUNTIME = Path(__file__).with_name("runtime.py")
_BRIDGE = Path(__file__).with_name("bridge.py")
_CHANNEL_MARKER = 'CHANNEL_PATHS = ("", "")'
BRIDGE_MODULE = "_gym_llm_bridge"
_REPL_OUTPUT_CHARS = 4_000_000  # the REPL's reply cap; what the agent sees is capped by the runtime itself
_SETUP_TIMEOUT_S = 60.0


def sandbox_configs(*, stage: Path, memory_limit_mb: int, command_timeout_s: float, eval_timeout_s: float,
                    workspace_mb: int, max_files: int, max_threads: int
                    ) -> tuple[SandboxConfig, SandboxConfig, SandboxConfig]:
    """The agent's, the grader's and the submission's sandbox settings: the same limits, different read-only binds
    (the grader's and the submission's share ``stage/channels``, where each grading's FIFOs are made)."""
    common = dict(isolation="bwrap", allow_subprocess=True, memory_limit_mb=memory_limit_mb, scratch_size_mb=workspace_mb,
                  max_files=max_files, max_threads=max_threads, file_size_limit_mb=min(workspace_mb, 1024),
                  max_output_chars=_REPL_OUTPUT_CHARS, max_error_chars=4096,
                  symlinks=(("/scratch/workspace", WORKSPACE), ("usr/bin", "/bin")))
    agent = SandboxConfig(timeout_s=command_timeout_s + 30, cpu_limit_s=max(60, math.ceil(command_timeout_s) + 30),
                          extra_ro_paths=(str(stage / "public"), "/usr/bin"), **common)
    grading = dict(timeout_s=eval_timeout_s + 30, cpu_limit_s=max(60, math.ceil(eval_timeout_s) + 30), **common)
    grader = SandboxConfig(extra_ro_paths=(str(stage / "private"), str(stage / "channels"), "/usr/bin"), **grading)
    submission = SandboxConfig(extra_ro_paths=(str(stage / "public"), str(stage / "channels"), "/usr/bin"), **grading)
    return agent, grader, submission


class SandboxREPL:
    """One REPL from ``pool`` with the runtime loaded; ``call(op, **args)`` runs one runtime operation."""

    def __init__(self, pool: SandboxPool):
        self.pool = pool
        self.sandbox: Sandbox | None = pool.acquire()
        try:
            self.channel: ReplChannel | None = self.sandbox.start_repl()
            self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> None:
        reply = self.channel.execute(_RUNTIME.read_text(encoding="utf-8"), timeout_s=load_scaled(_SETUP_TIMEOUT_S))
        if reply.status != "ok":
            raise SandboxError(f"the MLGym runtime did not load in the sandbox ({reply.status}): {reply.error}")

    def inside(self, host_path: Path) -> str:
        """Where a bound host path is seen inside this sandbox."""
        return _sandbox_path(str(host_path))

    def call(self, op: str, deadline_s: float, **args: Any) -> dict[str, Any]:
        """Run one operation; ``{"ok": True, "result": ...}`` or ``{"ok": False, "error": ...}``.

        Raises:
            SandboxError: the REPL died or timed out (the workspace is gone with it).
        """
        if self.channel is None:
            raise SandboxError("the workspace's sandbox was already closed")
        request = json.dumps({"op": op, "args": args})
        reply = self.channel.execute(f"_mlgym({request!r})", timeout_s=deadline_s)
        if reply.status != "ok":
            raise SandboxError(f"the sandbox stopped during {op!r} ({reply.status}: {reply.error[-500:]})")
        lines = [line for line in reply.output.splitlines() if line.startswith("{")]
        if not lines:
            raise SandboxError(f"the sandbox gave no reply to {op!r}: {reply.output[-500:]!r}")
        return json.loads(lines[-1])

    def close(self) -> None:
        sandbox, channel = self.sandbox, self.channel
        self.sandbox = self.channel = None
        if sandbox is None:
            return
        if channel is not None:
            sandbox.end_repl(channel)
        self.pool.release(sandbox, reusable=False)  # child processes may linger: never reuse


class WorkspaceSession:
    """One episode's workspace: a REPL in the agent's pool, set up from ``stage/public/<key>`` on first use."""

    def __init__(self, pool: SandboxPool, public_dir: Path):
        self.pool = pool
        self.public_dir = public_dir
        self.repl: SandboxREPL | None = None
        self.lost = False

    def call(self, op: str, deadline_s: float, **args: Any) -> dict[str, Any]:
        if self.repl is None:
            if self.lost:
                raise SandboxError("the workspace was lost earlier in this episode")
            self.repl = SandboxREPL(self.pool)
            setup = self.repl.call("setup", load_scaled(_SETUP_TIMEOUT_S), public_dir=self.repl.inside(self.public_dir))
            if not setup["ok"]:
                raise SandboxError(f"setting up the workspace failed: {setup['error']}")
        try:
            return self.repl.call(op, deadline_s, **args)
        except SandboxError:
            self.lost = True
            self.close()
            raise

    def read_files(self, names: tuple[str, ...], max_bytes: int) -> dict[str, bytes | None]:
        """The submission files' bytes (None: missing, a link, or larger than ``max_bytes``)."""
        reply = self.call("read_files", load_scaled(_SETUP_TIMEOUT_S), names=list(names), max_bytes=max_bytes)
        if not reply["ok"]:
            raise SandboxError(f"reading the submission failed: {reply['error']}")
        return {k: (base64.b64decode(v) if v is not None else None) for k, v in reply["result"].items()}

    def close(self) -> None:
        repl, self.repl = self.repl, None
        if repl is not None:
            repl.close()


@dataclass(frozen=True)
class Evaluation:
    """One run of a task's evaluation script on a submission.

    Attributes:
        metrics: the JSON object the script printed (empty when it printed none).
        output: the script's stdout and stderr.
        returncode: its exit status (None: it never ran).
        timed_out: it ran past the evaluation timeout.
        error: why no metrics came back ("" when they did).
        environment_error: the evaluation could not run at all (a sandbox did not start or failed, the runtime could
            not start it): a problem of this host, not of the submission; it must never be read as a score.
    """

    metrics: dict[str, Any]
    output: str
    returncode: int | None
    timed_out: bool
    error: str
    environment_error: bool = False


def parse_metrics(stdout: str) -> dict[str, Any] | None:
    """The last stdout line that is a JSON object (MLGym's evaluation scripts print one), or None.

    >>> parse_metrics('loading\\n{"Score": 1.5}\\n')
    {'Score': 1.5}
    """
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


@dataclass(frozen=True)
class SubmissionCode:
    """Where a grading runs the submission's Python modules: a REPL of ``pool`` set up from ``public_dir``, reached
    through FIFOs made in ``channels``; Python's ``random`` seeded with ``seed`` there as in the evaluation."""

    pool: SandboxPool
    public_dir: Path
    channels: Path
    seed: int | None


def module_name(path: str) -> str | None:
    """The import name of a submitted ``.py`` file (``strategy.py`` -> ``strategy``), None for other files."""
    if not path.endswith(".py"):
        return None
    return path[:-3].replace("/", ".")


def _proxy_source(module: str) -> str:
    return (f'"""{module}, as the grader sees it: its functions run in the submission\'s own sandbox (gym_llm)."""\n'
            f"import {BRIDGE_MODULE}\n{BRIDGE_MODULE}.install(globals(), {module!r})\n")


def evaluate(pool: SandboxPool, private_dir: Path, files: dict[str, bytes], argv: list[str], timeout_s: float,
             max_chars: int, code: SubmissionCode | None = None) -> Evaluation:
    """Run the evaluation in a fresh REPL of the grading ``pool`` (see the module docstring); with ``code``, the
    submitted ``.py`` files run in a REPL of ``code.pool`` instead, behind proxies."""
    modules = {name: module_name(name) for name in files} if code is not None else {}
    modules = {name: mod for name, mod in modules.items() if mod is not None}
    if not modules:
        return _grade(pool, private_dir, files, argv, timeout_s, max_chars)
    token = secrets.token_hex(16)
    call, reply = code.channels / f"{token}.call", code.channels / f"{token}.reply"
    served: dict[str, Any] = {}
    runner: SandboxREPL | None = None
    thread: threading.Thread | None = None
    try:
        for fifo in (call, reply):
            os.mkfifo(fifo)
            os.chmod(fifo, 0o666)  # root hosts: each sandbox's REPL runs as a uid of its own
        try:
            runner = SandboxREPL(code.pool)
        except SandboxError as e:
            return Evaluation({}, "", None, False, f"the submission's sandbox did not start: {e}", environment_error=True)
        bridge = _BRIDGE.read_text(encoding="utf-8")
        encoded = {name: base64.b64encode(data).decode() for name, data in files.items()}

        def serve() -> None:
            try:
                wall_s = load_scaled(timeout_s)  # it serves as long as the evaluation may run (see _grade)
                served.update(runner.call(
                    "serve_submission", wall_s + 20, public_dir=runner.inside(code.public_dir), files=encoded,
                    bridge=bridge, call=runner.inside(call), reply=runner.inside(reply), seed=code.seed,
                    modules=sorted(modules.values()), timeout_s=wall_s, max_chars=max_chars))
            except SandboxError as e:
                served["sandbox_error"] = str(e)

        thread = threading.Thread(target=serve, name="gym_llm_mlgym_submission", daemon=True)
        thread.start()
        grading_files = {name: data for name, data in files.items() if name not in modules}
        grading_files.update({name: _proxy_source(mod).encode() for name, mod in modules.items()})
        grader_bridge = bridge.replace(_CHANNEL_MARKER, f"CHANNEL_PATHS = {(runner.inside(call), runner.inside(reply))!r}")
        if grader_bridge == bridge:
            raise RuntimeError(f"{_BRIDGE} lost its {_CHANNEL_MARKER!r} line")
        grading_files[f"{BRIDGE_MODULE}.py"] = grader_bridge.encode()
        evaluation = _grade(pool, private_dir, grading_files, argv, timeout_s, max_chars)
    finally:
        if thread is not None:  # the submission's process ends when the evaluation closes the channel ...
            _release_waiters(call, reply)  # ... or never opened it: let its blocked open() return
            thread.join(timeout=5.0)
            if thread.is_alive() and runner is not None and runner.sandbox is not None:
                runner.sandbox.kill()  # its call then ends with an EOF in the serving thread
                thread.join(timeout=10.0)
        if runner is not None:
            runner.close()
        for fifo in (call, reply):
            try:
                os.unlink(fifo)
            except FileNotFoundError:
                pass
    result = served.get("result") if served.get("ok") else None
    if isinstance(result, dict):
        side = (result.get("stdout", "") + result.get("stderr", "")).strip()
        if side:
            evaluation = dataclasses.replace(
                evaluation, output=f"{evaluation.output}\n[the submission's own output]\n{side}")
    return evaluation


def _release_waiters(call: Path, reply: Path) -> None:
    """Open and close each FIFO's other end, so a process blocked opening it goes on (and then reads EOF)."""
    for path, flags in ((call, os.O_WRONLY | os.O_NONBLOCK), (reply, os.O_RDONLY | os.O_NONBLOCK)):
        try:
            os.close(os.open(path, flags))
        except OSError:  # ENXIO: nobody is reading the call FIFO
            pass


def _grade(pool: SandboxPool, private_dir: Path, files: dict[str, bytes], argv: list[str], timeout_s: float,
           max_chars: int) -> Evaluation:
    try:
        repl = SandboxREPL(pool)
    except SandboxError as e:
        return Evaluation({}, "", None, False, f"the grading sandbox did not start: {e}", environment_error=True)
    try:
        encoded = {name: base64.b64encode(data).decode() for name, data in files.items()}
        # the evaluation's budget is CPU time (what it computes does not slow down on a loaded machine); the wall
        # clock is only a backstop for one that waits, stretched by the load
        wall_s = load_scaled(timeout_s)
        reply = repl.call("grade", wall_s + 20, private_dir=repl.inside(private_dir), files=encoded, argv=argv,
                          timeout_s=wall_s, max_chars=max_chars, cpu_s=timeout_s)
    except SandboxError as e:
        return Evaluation({}, "", None, False, f"the grading sandbox failed: {e}", environment_error=True)
    finally:
        repl.close()
    if not reply["ok"]:
        return Evaluation({}, "", None, False, f"the evaluation could not start: {reply['error']}", environment_error=True)
    run = reply["result"]
    output = run["stdout"] + run["stderr"]
    if run["timed_out"]:
        return Evaluation({}, output, run["returncode"], True,
                          f"the evaluation used more than {timeout_s:g} CPU-seconds, or ran {wall_s:.0f} s")
    metrics = parse_metrics(run["stdout"])
    if metrics is None:
        return Evaluation({}, output, run["returncode"], False,
                          f"the evaluation script printed no JSON metrics (exit code {run['returncode']})")
    return Evaluation(metrics, output, run["returncode"], False, "")
