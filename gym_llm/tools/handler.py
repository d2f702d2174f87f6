"""Tools in chat envs: a :class:`~gym_llm.core.chat.TurnHandler` wrapper that runs tool calls.

After each assistant turn, :class:`ToolHandler` parses the reply. With tool calls, it runs them (in
order, through the episode's sessions) and answers ``Response(done=False, messages=<tool messages>)``;
the conversation continues. Without, it hands the reply to the task's own handler (e.g. GSM8K
scoring). On the last allowed turn (``turn == max_turns``) calls are not run: the reply goes to the
task's handler as the final answer.

``info`` of every step of a tool env has the same keys (so vector envs can batch them):
``num_tool_calls`` (int), ``tool_calls`` (a JSON list, one object per call with ``name``, ``code`` or
``arguments``, ``status``, ``duration_s``, ``truncated``) and ``num_tool_calls_skipped`` (calls on the
last turn, not run).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Sequence

from gym_llm.core.chat import ChatEpisode, Response, TurnHandler
from gym_llm.core.episode import ForkError
from gym_llm.core.messages import Message
from gym_llm.tools.base import Tool, ToolCall, ToolResult, ToolSession, check_tools, index_tools, invalid_result
from gym_llm.tools.parsing import parse_tool_calls

__all__ = ["Toolbox", "ToolHandler", "with_tools"]

logger = logging.getLogger(__name__)

_SESSIONS = "gym_llm.tools"  # key in ChatEpisode.resources


class Toolbox:
    """Several tools behind one parser: routes each call to the tool that owns its function name.

    Args:
        tools: :class:`~gym_llm.tools.base.Tool` objects with distinct function names.
        max_calls_per_turn: calls beyond this many in one reply are answered with an error (bounds a
            reply's total tool time at ``max_calls_per_turn * timeout``).
    """

    def __init__(self, tools: Sequence[Tool], *, max_calls_per_turn: int = 8):
        self.tools = check_tools(tools)
        if isinstance(max_calls_per_turn, bool) or not isinstance(max_calls_per_turn, int) or max_calls_per_turn < 1:
            raise ValueError(f"max_calls_per_turn must be an int >= 1, got {max_calls_per_turn!r}.")
        self.max_calls_per_turn = max_calls_per_turn
        self.by_name: dict[str, Tool] = {}
        code_tools = [t for t in self.tools if t.code_blocks]
        self.code_block_tool = code_tools[0].names[0] if code_tools else None
        self._attached = False

    def attach(self) -> None:
        """Start every tool (idempotent per toolbox); undone by :meth:`detach`."""
        if self._attached:
            return
        done = []
        try:
            for tool in self.tools:
                tool.attach()
                done.append(tool)
            self.by_name = index_tools(self.tools)
        except BaseException:
            for tool in done:
                tool.detach()
            raise
        self._attached = True

    def detach(self) -> None:
        if not self._attached:
            return
        self._attached = False
        for tool in self.tools:
            try:
                tool.detach()
            except Exception:  # one tool failing to stop must not keep the others running
                logger.exception("detaching %r failed", tool)

    def schemas(self) -> list[dict[str, Any]]:
        return [schema for tool in self.tools for schema in tool.schemas()]

    def parse(self, text: str) -> list[ToolCall]:
        """The calls in an assistant message (see :func:`~gym_llm.tools.parsing.parse_tool_calls`)."""
        return parse_tool_calls(text, code_block_tool=self.code_block_tool)

    def run(self, calls: Sequence[ToolCall], sessions: "ToolSessions") -> list[ToolResult]:
        """Run calls in order; malformed calls, unknown names and failures become error results."""
        results = []
        for index, call in enumerate(calls):
            if call.error is not None:
                results.append(invalid_result(call, f"invalid tool call: {call.error}"))
            elif call.name not in self.by_name:
                results.append(invalid_result(call, f"unknown tool {call.name!r}; available: {sorted(self.by_name)}."))
            elif index >= self.max_calls_per_turn:
                results.append(invalid_result(call, f"at most {self.max_calls_per_turn} tool calls per reply; "
                                                    "this one was not run."))
            else:
                results.append(sessions.run(self.by_name[call.name], call))
        return results

    def open_sessions(self) -> "ToolSessions":
        return ToolSessions()


class ToolSessions:
    """An episode's sessions, one per tool, opened on first use."""

    def __init__(self) -> None:
        self._sessions: dict[int, ToolSession] = {}

    def run(self, tool: Tool, call: ToolCall) -> ToolResult:
        session = self._sessions.get(id(tool))
        if session is None:
            session = self._sessions[id(tool)] = tool.open_session()
        try:
            return session.run(call)
        except Exception as e:  # a tool's bug must not escape env.step
            logger.exception("tool %r raised on %r", call.name, call)
            return ToolResult(call, f"Error: the {call.name} tool failed: {type(e).__name__}: {e}", "error")

    def fork(self) -> "ToolSessions":
        """A sibling episode's sessions: each open session forked (see :meth:`gym_llm.core.episode.Episode.fork`);
        a session that cannot be forked refuses with a :class:`~gym_llm.core.episode.ForkError` naming its tool, and
        the sessions forked before it are closed."""
        sibling = ToolSessions()
        try:
            for key, session in self._sessions.items():
                fork = getattr(session, "fork", None)
                if not callable(fork):
                    raise ForkError(f"the episode's {type(session).__qualname__} session cannot be forked (it has no "
                                    "fork()); give the tool's session a fork() or do not fork episodes that use it.")
                sibling._sessions[key] = fork()
        except BaseException:
            sibling.close()
            raise
        return sibling

    def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            try:
                session.close()
            except Exception:
                logger.exception("closing a tool session failed")


def _info(results: Sequence[ToolResult], skipped: int) -> dict[str, Any]:
    return {"num_tool_calls": len(results), "tool_calls": json.dumps([r.to_info() for r in results], ensure_ascii=False),
            "num_tool_calls_skipped": skipped}


class ToolHandler:
    """Wraps a task's :class:`~gym_llm.core.chat.TurnHandler` with tool calling (see the module docstring)."""

    def __init__(self, inner: TurnHandler, toolbox: Toolbox):
        self.inner = inner
        self.toolbox = toolbox

    def start(self, episode: ChatEpisode) -> None:
        episode.resources[_SESSIONS] = self.toolbox.open_sessions()
        start = getattr(self.inner, "start", None)
        if start is not None:
            start(episode)

    def respond(self, episode: ChatEpisode, reply: Message) -> Response:
        calls = self.toolbox.parse(reply.content)
        last_turn = episode.turn + 1 >= episode.config.max_turns
        if not calls or last_turn:
            response = self.inner.respond(episode, reply)
            return Response(response.reward, response.done, response.messages,
                             {**_info((), len(calls)), **response.info})
        sessions = episode.resources.get(_SESSIONS)
        if sessions is None:  # a handler used without start(): keep serving
            sessions = episode.resources[_SESSIONS] = self.toolbox.open_sessions()
        results = self.toolbox.run(calls, sessions)
        return Response(0.0, False, tuple(r.to_message() for r in results), _info(results, 0))

    def close(self, episode: ChatEpisode) -> None:
        sessions = episode.resources.pop(_SESSIONS, None)
        if sessions is not None:
            sessions.close()
        close = getattr(self.inner, "close", None)
        if close is not None:
            close(episode)


def with_tools(handler: TurnHandler, tools: Sequence[Tool] | None, *, max_turns: int,
               max_calls_per_turn: int = 8
               ) -> tuple[TurnHandler, list[dict[str, Any]] | None, Callable[[], None] | None]:
    """What an env builder needs to add ``tools=[...]``: the wrapped handler, the schemas for the chat
    template, and the ``on_close`` hook that stops the tools. Without tools: ``(handler, None, None)``.

    Raises:
        ValueError: ``max_turns < 2`` (the last turn is always the final answer, so no call could run).
    """
    if not tools:
        return handler, None, None
    if max_turns < 2:
        raise ValueError(
            f"tools=[...] need max_turns >= 2 (calls on the last turn are not run: that reply is the final answer), "
            f"got max_turns={max_turns}; pass e.g. max_turns=4."
        )
    toolbox = Toolbox(tools, max_calls_per_turn=max_calls_per_turn)
    toolbox.attach()
    try:
        schemas = toolbox.schemas()
    except BaseException:
        toolbox.detach()
        raise
    return ToolHandler(handler, toolbox), schemas, toolbox.detach
