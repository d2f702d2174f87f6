"""``MCPTool``: the functions of a Model Context Protocol server, over stdio, as env tools.

Uses the official ``mcp`` 2.x client (imported only when a tool is attached, so ``import gym_llm``
stays light). The client is async; each attached ``MCPTool`` runs one asyncio loop in a daemon
thread that owns the connection (``mcp.Client`` over the ``stdio_client`` transport: the form every mcp 2.x accepts;
from 2.3 ``Client`` also takes ``StdioServerParameters`` and does the same), and env threads
submit calls to it. On attach: start the server, initialize, list its tools (their JSON schemas go
into the prompt through the chat template's ``tools``). On the last detach (``env.close()``): leave
the client context, which shuts the server process down.

Results become text tool messages: text content is joined, other content is named but not inlined.
A tool-side error (``isError``), a timeout, or a server that died becomes an error tool message; a
dead server is restarted on the next call.
"""

from __future__ import annotations

from gym_llm.core.episode import ForkError
from gym_llm.core.pickling import ConstructorPickle
import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from typing import Any, Mapping, Sequence

from gym_llm.tools.base import ToolCall, ToolResult, function_schema

__all__ = ["MCPTool"]

logger = logging.getLogger(__name__)


def _import_mcp():
    try:
        import mcp
    except ImportError as e:
        raise ImportError("MCPTool needs the MCP client: pip install 'gym-llm[tools]' (mcp>=2.0,<3).") from e
    return mcp


class _Connection:
    """One running server + client session, driven by a private event loop thread."""

    def __init__(self, params: Any, startup_timeout_s: float):
        mcp = _import_mcp()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="gym_llm_mcp", daemon=True)
        self.thread.start()
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._stop: asyncio.Event | None = None
        self.client = None
        self.broken = False  # a call failed on the transport: reconnect before the next one
        self.lifecycle = asyncio.run_coroutine_threadsafe(self._run(mcp, params), self.loop)
        try:
            self.tools = self._ready.result(timeout=startup_timeout_s)
        except BaseException:
            self.close()
            raise

    async def _run(self, mcp, params) -> None:
        self._stop = asyncio.Event()
        try:
            from mcp.client.stdio import stdio_client

            async with mcp.Client(stdio_client(params)) as client:
                self.client = client
                tools, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self._ready.set_result(tools)
                await self._stop.wait()
        except BaseException as e:
            if not self._ready.done():
                self._ready.set_exception(e)
            else:
                logger.warning("MCP server connection ended: %s: %s", type(e).__name__, e)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self.client = None

    @property
    def alive(self) -> bool:
        return not self.broken and not self.lifecycle.done() and self.client is not None

    def call(self, name: str, arguments: Mapping[str, Any], timeout_s: float):
        client = self.client
        if client is None:
            raise ConnectionError("the MCP connection is closed")
        future = asyncio.run_coroutine_threadsafe(client.call_tool(name, dict(arguments)), self.loop)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None
        except Exception:
            self.broken = True
            raise

    def close(self, timeout_s: float = 10.0) -> None:
        if self._stop is not None and not self.lifecycle.done():
            self.loop.call_soon_threadsafe(self._stop.set)
        try:
            self.lifecycle.result(timeout=timeout_s)
        except BaseException as e:  # already reported by _run
            logger.debug("MCP lifecycle ended with %r", e)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=timeout_s)
        if not self.thread.is_alive():
            self.loop.close()


class MCPTool(ConstructorPickle):
    """The tools of one MCP server started over stdio (``command args...``).

    Args:
        command: the server executable (e.g. ``sys.executable``, ``"npx"``, ``"uvx"``).
        args: its arguments.
        env: extra environment variables for the server (merged over the MCP defaults).
        cwd: its working directory.
        name_prefix: prepended to every function name (to tell servers apart: ``"fs_"``).
        include: only expose these server tool names (default: all).
        timeout_s: per-call limit; a slower call returns a ``timeout`` error message.
        startup_timeout_s: limit for starting the server and listing its tools.
        max_output_chars: longer results are cut with a visible marker.

    Example::

        fs = MCPTool(sys.executable, ["my_server.py"], name_prefix="fs_")
        env = gym.make("LLMChat-v0", tools=[PythonTool(), fs])
    """

    code_blocks = False

    def __init__(self, command: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike | None = None, name_prefix: str = "", include: Sequence[str] | None = None,
                 timeout_s: float = 30.0, startup_timeout_s: float = 30.0, max_output_chars: int = 8192):
        if not isinstance(command, str) or not command:
            raise TypeError(f"command must be the server executable as a str, got {command!r}.")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise TypeError(f"args must be a list of str, got {args!r}.")
        for label, value in (("timeout_s", timeout_s), ("startup_timeout_s", startup_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{label} must be a number > 0, got {value!r}.")
        self.command, self.args = command, list(args)
        self.env = dict(env) if env else None
        self.cwd = str(cwd) if cwd is not None else None
        self.name_prefix = name_prefix
        self.include = set(include) if include is not None else None
        self.timeout_s, self.startup_timeout_s = float(timeout_s), float(startup_timeout_s)
        self.max_output_chars = int(max_output_chars)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._connection: _Connection | None = None
        self._refs = 0
        self._schemas: list[dict[str, Any]] = []
        self.names: tuple[str, ...] = ()
        self._owner_pid = os.getpid()

    def _after_fork(self) -> None:
        """A forked child inherits the parent's connection object but not its event-loop thread: reset."""
        if self._owner_pid != os.getpid():
            self._init_runtime()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_lock", "_connection", "_refs", "_schemas", "names", "_owner_pid"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # ----------------------------------------------------------------------------- lifecycle
    def _connect(self) -> _Connection:
        mcp = _import_mcp()
        params = mcp.StdioServerParameters(command=self.command, args=self.args, env=self.env, cwd=self.cwd)
        connection = _Connection(params, self.startup_timeout_s)
        tools = [t for t in connection.tools if self.include is None or t.name in self.include]
        self._schemas = [function_schema(self.name_prefix + t.name, t.description or "", t.input_schema or {})
                         for t in tools]
        self.names = tuple(s["function"]["name"] for s in self._schemas)
        return connection

    def attach(self) -> None:
        self._after_fork()
        with self._lock:
            self._refs += 1
            if self._connection is None:
                try:
                    self._connection = self._connect()
                except BaseException:
                    self._refs -= 1
                    raise

    def detach(self) -> None:
        self._after_fork()
        with self._lock:
            self._refs = max(0, self._refs - 1)
            connection = self._connection if self._refs == 0 else None
            if connection is not None:
                self._connection = None
        if connection is not None:
            connection.close()

    def schemas(self) -> list[dict[str, Any]]:
        if not self.names:
            raise RuntimeError("MCPTool lists its functions once attached; call tool.attach() (envs do) first.")
        return list(self._schemas)

    def open_session(self) -> "MCPTool":
        return self  # stateless per episode: all episodes share the server connection

    def close(self) -> None:
        """Per-episode close: nothing to release (the connection lives until the last detach)."""

    def fork(self) -> "MCPTool":
        """Refused: an MCP server's state lives in its own process, shared by every episode, and the protocol has no
        way to copy it, so a sibling could not diverge from its parent."""
        raise ForkError(f"an episode that has called the MCP tool {self.command!r} cannot be forked: the server's "
                        "state lives in its own process, shared by every episode, and MCP has no way to copy it. "
                        "Fork before the first MCP call, or use a tool whose state the env holds (e.g. PythonTool).")

    # ---------------------------------------------------------------------------------- calls
    def _live_connection(self) -> _Connection:
        self._after_fork()
        with self._lock:
            if self._refs == 0:
                raise RuntimeError("the MCP tool is not attached to an env")
            if self._connection is None or not self._connection.alive:
                if self._connection is not None:
                    logger.warning("MCP server %s died; restarting it", self.command)
                    self._connection.close(timeout_s=2.0)
                self._connection = self._connect()
            return self._connection

    def run(self, call: ToolCall) -> ToolResult:
        start = time.perf_counter()
        server_name = call.name[len(self.name_prefix):]
        try:
            result = self._live_connection().call(server_name, call.arguments, self.timeout_s)
        except TimeoutError:
            return ToolResult(call, f"Error: {call.name} did not answer within {self.timeout_s:g} s.", "timeout",
                              time.perf_counter() - start)
        except Exception as e:  # connection lost, protocol error, server failed to restart
            return ToolResult(call, f"Error: calling {call.name} failed: {type(e).__name__}: {e}", "crashed",
                              time.perf_counter() - start)
        text, truncated = self._text(result)
        status = "error" if result.is_error else "ok"
        return ToolResult(call, text, status, time.perf_counter() - start, truncated)

    def _text(self, result: Any) -> tuple[str, bool]:
        parts = []
        for block in result.content or ():
            kind = getattr(block, "type", type(block).__name__)
            parts.append(block.text if kind == "text" else f"[{kind} content omitted]")
        text = "\n".join(parts)
        if not text and result.structured_content is not None:
            import json

            text = json.dumps(result.structured_content, ensure_ascii=False)
        if result.is_error and not text.startswith("Error"):
            text = f"Error: {text}"
        if len(text) > self.max_output_chars:
            omitted = len(text) - self.max_output_chars
            return text[: self.max_output_chars] + f"\n[... {omitted} more characters of output truncated ...]", True
        return text or "(no output)", False

    def __repr__(self) -> str:
        return f"MCPTool({self.command!r}, {self.args!r}, names={self.names})"
