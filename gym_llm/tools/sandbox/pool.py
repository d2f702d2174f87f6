"""A pool of warm sandboxes, shared by every episode (and every sub-env) that uses one Python tool.

A sandbox serves one episode at a time; at the episode's end its REPL process is killed, its scratch
dir wiped, and the sandbox goes back to the pool for the next episode, which gets a freshly forked
REPL (about a millisecond) instead of a new sandbox (tens of milliseconds). A sandbox that misbehaved
(its zygote died or stopped answering, its scratch dir could not be wiped, or it reached
``max_episodes_per_sandbox``) is killed and replaced.

All sandboxes are spawned by one long-lived thread per pool: bubblewrap's ``--die-with-parent`` ties a
sandbox's life to the *thread* that started it, so worker threads (which come and go) must not.
"""

from __future__ import annotations

import logging
import threading
import time

from gym_llm.core.load import load_scaled
from gym_llm.tools.sandbox.config import SandboxConfig
from gym_llm.tools.sandbox.process import Sandbox, SandboxError

__all__ = ["SandboxPool"]

logger = logging.getLogger(__name__)

_RETRY_AFTER_ERROR_S = 1.0


class SandboxPool:
    """Thread-safe pool of warm :class:`~gym_llm.tools.sandbox.process.Sandbox` objects.

    Args:
        config: the sandbox settings.
        min_idle: spare sandboxes kept started beyond those in use.
        bwrap: path to the bwrap binary (default: see :func:`~gym_llm.tools.sandbox.process.find_bwrap`).
    """

    def __init__(self, config: SandboxConfig, *, min_idle: int = 1, bwrap: str | None = None):
        if isinstance(min_idle, bool) or not isinstance(min_idle, int) or min_idle < 0:
            raise ValueError(f"min_idle must be an int >= 0, got {min_idle!r}.")
        self.config = config
        self.min_idle = min_idle
        self.bwrap = bwrap
        self._cond = threading.Condition()
        self._idle: list[Sandbox] = []
        self._busy = 0
        self._waiting = 0
        self._reserve = 0
        self._error: BaseException | None = None
        self._error_at = 0.0
        self._closed = False
        self.spawned = 0
        self.killed = 0
        self._spawning = False
        self._thread = threading.Thread(target=self._spawn_loop, name="gym_llm_sandbox_spawner", daemon=True)
        self._thread.start()

    # -------------------------------------------------------------------------------- public
    def prewarm(self, count: int, *, wait: bool = False) -> None:
        """Keep at least ``count`` sandboxes started (idle or in use); with ``wait``, block until they are."""
        with self._cond:
            self._reserve = max(self._reserve, int(count))
            self._cond.notify_all()
            if wait:
                deadline = time.monotonic() + load_scaled(self.config.startup_timeout_s) * max(1, count)
                while len(self._idle) + self._busy < self._reserve and not self._closed:
                    self._raise_error()
                    if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                        raise SandboxError(f"prewarming {count} sandboxes timed out")

    def acquire(self, timeout_s: float | None = None) -> Sandbox:
        """An idle sandbox, waiting for the spawner when none is ready.

        Raises:
            SandboxError: the pool is closed, sandboxes fail to start, or ``timeout_s`` passed.
        """
        timeout_s = load_scaled(self.config.startup_timeout_s) if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
            try:
                while not self._idle:
                    if self._closed:
                        raise SandboxError("the sandbox pool is closed")
                    self._raise_error()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._cond.wait(remaining) and not self._idle:
                        raise SandboxError(f"no sandbox became ready within {timeout_s:.1f} s")
                sandbox = self._idle.pop()
                self._busy += 1
                self._cond.notify_all()
                return sandbox
            finally:
                self._waiting -= 1

    def release(self, sandbox: Sandbox, *, reusable: bool = True) -> None:
        """Give a sandbox back; it is reused only if healthy (its REPL must already be ended)."""
        keep = (reusable and sandbox.alive and sandbox.episodes < self.config.max_episodes_per_sandbox)
        with self._cond:
            self._busy -= 1
            if keep and not self._closed:
                self._idle.append(sandbox)
                self._cond.notify_all()
                return
            self._cond.notify_all()
            self.killed += 1
        sandbox.kill()

    @property
    def idle(self) -> int:
        with self._cond:
            return len(self._idle)

    def settled(self, timeout_s: float = 10.0) -> int:
        """Wait until no sandbox is being started; return how many are alive (idle or in use)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (self._spawning or self._needed() > 0 and self._error is None) and not self._closed:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    break
            return len(self._idle) + self._busy

    def close(self) -> None:
        """Kill the idle sandboxes and stop the spawner; busy ones are killed when released."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for sandbox in idle:
            sandbox.kill()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self.config.startup_timeout_s)

    # ------------------------------------------------------------------------------ spawner
    def _raise_error(self) -> None:
        if self._error is not None:
            raise SandboxError(f"sandboxes fail to start: {self._error}") from self._error

    def _needed(self) -> int:
        spare = self.min_idle + self._waiting - len(self._idle)
        reserve = self._reserve - (len(self._idle) + self._busy)
        return max(spare, reserve)

    def _spawn_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self._needed() <= 0:
                    self._cond.wait()
                if self._closed:
                    return
                if self._error is not None:
                    pause = self._error_at + _RETRY_AFTER_ERROR_S - time.monotonic()
                    if pause > 0:
                        self._cond.wait(pause)
                        continue
                self._spawning = True
            try:
                sandbox = Sandbox.spawn(self.config, self.bwrap)
            except Exception as e:  # surfaced to acquirers; retried after a pause
                logger.error("starting a sandbox failed: %s", e)
                with self._cond:
                    self._spawning = False
                    self._error, self._error_at = e, time.monotonic()
                    self._cond.notify_all()
                continue
            with self._cond:
                self._spawning = False
                self.spawned += 1
                self._error = None
                if self._closed:
                    sandbox.kill()
                    return
                self._idle.append(sandbox)
                self._cond.notify_all()
