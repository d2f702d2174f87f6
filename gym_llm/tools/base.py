"""The tool protocol: calls parsed from an assistant message, results that become ``tool`` messages.

A :class:`Tool` is a lazy *spec* (picklable, cheap to build) until an env attaches it; then it starts
what it needs (a sandbox pool, an MCP server). Each episode opens a :class:`ToolSession` on it (a
Python REPL of its own; MCP sessions share the tool's connection), runs calls through it, and closes
it when the episode ends. When the last env detaches, the tool stops its processes; attaching again
restarts them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Protocol, Sequence, runtime_checkable

from gym_llm.core.messages import Message

__all__ = ["Tool", "ToolCall", "ToolResult", "ToolSession", "ToolStatus", "function_schema"]

ToolStatus = Literal["ok", "error", "timeout", "crashed", "invalid"]
"""``ok``; ``error`` (the code raised / the tool reported an error); ``timeout``; ``crashed`` (the
process died and was restarted); ``invalid`` (the call could not be parsed or names no tool)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call parsed from an assistant message.

    Attributes:
        name: the function name (``"python"`` for fenced code blocks).
        arguments: the call's arguments (``{"code": ...}`` for Python).
        call_id: the id given in the call, if any (echoed as the tool message's ``tool_call_id``).
        error: why the call is malformed; a malformed call is answered with an error tool message.
        format: where it came from: a ``code_block`` (```python fence) or a ``tool_call`` JSON tag.
    """

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    call_id: str | None = None
    error: str | None = None
    format: Literal["code_block", "tool_call"] = "tool_call"


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one call.

    Attributes:
        call: the call.
        content: the text the model sees in the ``tool`` message.
        status: see :data:`ToolStatus`.
        duration_s: wall time of the call on the host.
        truncated: part of the output was cut (the content says so with a visible marker).
    """

    call: ToolCall
    content: str
    status: ToolStatus = "ok"
    duration_s: float = 0.0
    truncated: bool = False

    def to_message(self) -> Message:
        """The ``tool``-role message for the conversation."""
        return Message("tool", self.content, name=self.call.name or None, tool_call_id=self.call.call_id)

    def to_info(self) -> dict[str, Any]:
        """A JSON-able summary for ``info["tool_calls"]``: name, code/arguments, status, duration, truncation."""
        info: dict[str, Any] = {"name": self.call.name, "status": self.status,
                                "duration_s": round(self.duration_s, 6), "truncated": self.truncated}
        code = self.call.arguments.get("code") if isinstance(self.call.arguments, Mapping) else None
        if isinstance(code, str):
            info["code"] = code
        else:
            info["arguments"] = json.dumps(self.call.arguments, default=str, ensure_ascii=False)
        return info


@runtime_checkable
class ToolSession(Protocol):
    """One episode's use of a tool. ``run`` never raises for anything the call does."""

    def run(self, call: ToolCall) -> ToolResult: ...

    def close(self) -> None: ...


@runtime_checkable
class Tool(Protocol):
    """A tool (or a set of functions served together, like one MCP server).

    Attributes:
        names: the function names this tool answers to.
        code_blocks: whether fenced ```python blocks are calls to this tool (only the Python tool).
    """

    names: tuple[str, ...]
    code_blocks: bool

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style function schemas (``{"type": "function", "function": {...}}``), one per name;
        passed to the chat template's ``tools``."""
        ...

    def attach(self) -> None:
        """An env starts using the tool: start its processes if they are not running."""
        ...

    def detach(self) -> None:
        """An env stops using the tool: stop its processes once no env uses it."""
        ...

    def open_session(self) -> ToolSession:
        """Per-episode state (cheap: resources are acquired on the first call)."""
        ...


def function_schema(name: str, description: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI/Hugging Face function schema, the form chat templates expect in ``tools``."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": dict(parameters)}}


def invalid_result(call: ToolCall, message: str) -> ToolResult:
    """The error result for a malformed call or an unknown tool."""
    return ToolResult(call, f"Error: {message}", "invalid")


def check_tools(tools: Sequence[Any] | None) -> tuple[Tool, ...]:
    """Validate a ``tools=[...]`` argument: :class:`Tool` objects, at most one taking code blocks."""
    if tools is None:
        return ()
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise TypeError(
            f"tools must be a list of tools (e.g. [PythonTool(), MCPTool('python', ['server.py'])]), got "
            f"{type(tools).__name__}."
        )
    for tool in tools:
        if not isinstance(tool, Tool):
            raise TypeError(
                f"Each tool must implement gym_llm.tools.Tool (names, code_blocks, schemas, attach, detach, "
                f"open_session), got {type(tool).__name__}; use gym_llm.tools.PythonTool or MCPTool."
            )
    if sum(bool(t.code_blocks) for t in tools) > 1:
        raise ValueError("More than one tool takes fenced ```python blocks; set code_blocks=False on all but one.")
    return tuple(tools)


def index_tools(tools: Sequence[Tool]) -> dict[str, Tool]:
    """Function name -> tool (names are known once tools are attached). Raises on duplicates."""
    index: dict[str, Tool] = {}
    for tool in tools:
        for name in tool.names:
            if name in index:
                raise ValueError(
                    f"Two tools answer to the function name {name!r} ({index[name]!r} and {tool!r}); "
                    "give one a different name or name_prefix."
                )
            index[name] = tool
    return index
