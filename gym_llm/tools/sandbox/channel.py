"""The host end of one REPL: its two pipes, the framed request and the checked reply of each call.

:class:`~gym_llm.tools.sandbox.process.Sandbox` hands one out per episode (:meth:`~.Sandbox.start_repl`);
:mod:`gym_llm.tools.sandbox.family` makes them for the copy-on-write copies of a REPL.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Literal

from gym_llm.core.fdwait import wait_fd
from gym_llm.core.load import load_scaled
from gym_llm.tools.sandbox.config import SandboxConfig
from gym_llm.tools.sandbox.server import SETTLE_S


@dataclass(frozen=True, slots=True)
class ReplReply:
    """What one call returned.

    Attributes:
        status: ``"ok"``, ``"error"`` (user code raised), ``"timeout"`` (wall clock), ``"crashed"``
            (the REPL died or broke the protocol while running this call) or ``"dead"`` (the REPL was
            already gone before this call: the code did not run).
        output: captured stdout/stderr (the first ``max_output_chars``).
        omitted_chars: characters of output dropped past the cap.
        error: the formatted traceback (``status == "error"``) or why the REPL stopped.
        duration_s: wall time of the call as seen by the host.
        wait_status: how the REPL process ended (``crashed``/``dead``, when its relay saw it), else None.
    """

    status: Literal["ok", "error", "timeout", "crashed", "dead"]
    output: str
    omitted_chars: int
    error: str
    duration_s: float
    wait_status: int | None = None


def _clean_text(value: object) -> str:
    """A str without lone surrogates (tokenizers reject them)."""
    text = value if isinstance(value, str) else str(value)
    return text.encode("utf-8", "replace").decode("utf-8")


class ReplChannel:
    """The host end of one REPL's two pipes. Not thread-safe: one episode uses it at a time."""

    def __init__(self, request_fd: int, reply_fd: int, config: SandboxConfig, *, pidfd: int | None = None,
                 channel_fd: int | None = None):
        self.request_fd = request_fd
        self.reply_fd = reply_fd
        self.config = config
        self.pidfd = pidfd  # the REPL process (a copy-on-write fork needs it; None: not forkable so)
        self.channel_fd = channel_fd  # the REPL's end of its relay socket, as a number in the REPL
        self.seccomp_filters: int | None = None  # how many filters confine the REPL, read before it ran user code
        self.max_reply_bytes = 65_536 + 12 * (config.max_output_chars + config.max_error_chars)
        os.set_blocking(request_fd, False)
        os.set_blocking(reply_fd, False)

    def execute(self, code: str, timeout_s: float | None = None) -> ReplReply:
        """Run ``code`` in the REPL; never raises for anything the code does."""
        start = time.perf_counter()
        deadline = start + (self.config.timeout_s if timeout_s is None else timeout_s)
        request = json.dumps({"code": code, "max_output_chars": self.config.max_output_chars,
                              "max_error_chars": self.config.max_error_chars,
                              "settle_s": load_scaled(SETTLE_S)}).encode()
        try:
            write_all(self.request_fd, len(request).to_bytes(4, "big") + request, deadline)
        except BrokenPipeError:  # nobody reads the request: the REPL died before this call
            return ReplReply("dead", "", 0, "", time.perf_counter() - start)
        except TimeoutError:
            return ReplReply("timeout", "", 0, "", time.perf_counter() - start)
        try:
            header = self._read(4, deadline)
            size = int.from_bytes(header, "big")
            if size > self.max_reply_bytes:
                raise _Broken(f"reply of {size} bytes exceeds the protocol's {self.max_reply_bytes}")
            reply = json.loads(self._read(size, deadline))
            status = reply["status"]
            if status in ("crashed", "dead"):  # the relay saw the REPL end
                wait_status = reply.get("wait_status")
                return ReplReply(status, "", 0, _clean_text(reply.get("error", ""))[:2000], time.perf_counter() - start,
                                 wait_status if isinstance(wait_status, int) else None)
            if status not in ("ok", "error"):
                raise _Broken(f"unknown status {status!r}")
            return ReplReply(status, _clean_text(reply["output"]), int(reply["omitted_chars"]),
                             _clean_text(reply["error"]), time.perf_counter() - start)
        except TimeoutError:
            return ReplReply("timeout", "", 0, "", time.perf_counter() - start)
        except (_Broken, OSError, ValueError, KeyError, TypeError) as e:
            return ReplReply("crashed", "", 0, str(e), time.perf_counter() - start)

    def _read(self, n: int, deadline: float) -> bytes:
        chunks, got = [], 0
        while got < n:
            try:
                chunk = os.read(self.reply_fd, n - got)
            except BlockingIOError:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    raise TimeoutError from None
                wait_fd(self.reply_fd, timeout_s=remaining)
                continue
            if not chunk:
                raise _Broken("the REPL closed its output")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        for fd in (self.request_fd, self.reply_fd, self.pidfd):
            try:
                if fd is not None and fd >= 0:
                    os.close(fd)
            except OSError:
                pass
        self.request_fd = self.reply_fd = -1
        self.pidfd = None


def write_all(fd: int, data: bytes, deadline: float) -> None:
    """Write all of ``data`` to the non-blocking ``fd``; ``TimeoutError`` past ``deadline`` (``time.perf_counter()``)."""
    view = memoryview(data)
    while view:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise TimeoutError
        if wait_fd(fd, write=True, timeout_s=remaining):
            view = view[os.write(fd, view):]


class _Broken(Exception):
    """The REPL stopped following the protocol (it died, or user code wrote to its pipe)."""

