"""Chat messages: the typed unit that crosses module boundaries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

__all__ = ["Message", "Role", "as_message", "as_messages"]

Role = Literal["system", "user", "assistant", "tool"]
_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True, init=False)
class Message:
    """One chat message.

    Attributes:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``.
        content: the message text.
        name: for ``tool`` messages, the tool's name (templates that show it use it).
        tool_call_id: for ``tool`` messages, the id of the call this answers, when the call had one.
        tool_calls: for ``assistant`` messages, the parsed calls in OpenAI form
            (``{"type": "function", "function": {"name": ..., "arguments": {...}}}``); empty otherwise.
    """

    role: Role
    content: str
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: tuple[Mapping[str, Any], ...] = field(default=())

    def __init__(self, role: Role, content: str, name: str | None = None, tool_call_id: str | None = None,
                 tool_calls: tuple[Mapping[str, Any], ...] = ()) -> None:
        if role not in _ROLES:
            raise ValueError(f"Message role must be one of {_ROLES}, got {role!r}.")
        if not isinstance(content, str):
            raise TypeError(
                f"Message content must be a str, got {type(content).__name__}; convert it with str() first."
            )
        # Written by hand because the frozen dataclass __init__ sets every field through
        # object.__setattr__, and that made building a Message (one per env step) a fifth of a text-mode
        # vector step; the slots' own descriptors set the same fields at half the cost.
        _set_role(self, role)
        _set_content(self, content)
        _set_name(self, name)
        _set_tool_call_id(self, tool_call_id)
        _set_tool_calls(self, tool_calls)

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI/Hugging Face chat-template form: ``{"role": ..., "content": ..., ...}``."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [dict(c) for c in self.tool_calls]
        return out


_set_role = Message.role.__set__  # type: ignore[attr-defined]  # slot descriptors (see Message.__init__)
_set_content = Message.content.__set__  # type: ignore[attr-defined]
_set_name = Message.name.__set__  # type: ignore[attr-defined]
_set_tool_call_id = Message.tool_call_id.__set__  # type: ignore[attr-defined]
_set_tool_calls = Message.tool_calls.__set__  # type: ignore[attr-defined]


def as_message(obj: Message | Mapping[str, Any]) -> Message:
    """Coerce a ``Message`` or a ``{"role", "content"}`` mapping into a :class:`Message`."""
    if isinstance(obj, Message):
        return obj
    if isinstance(obj, Mapping):
        if "role" not in obj or "content" not in obj:
            raise ValueError(
                f"A message mapping needs 'role' and 'content' keys, got keys {sorted(obj)}; "
                "write it as {'role': 'user', 'content': '...'}."
            )
        return Message(
            role=obj["role"],
            content=obj["content"],
            name=obj.get("name"),
            tool_call_id=obj.get("tool_call_id"),
            tool_calls=tuple(obj.get("tool_calls") or ()),
        )
    raise TypeError(f"Expected a Message or a mapping with 'role' and 'content', got {type(obj).__name__}.")


def as_messages(objs: Sequence[Message | Mapping[str, Any]]) -> tuple[Message, ...]:
    """Coerce a sequence of messages (see :func:`as_message`)."""
    if isinstance(objs, (str, bytes)) or not isinstance(objs, Sequence):
        raise TypeError(f"Expected a sequence of messages, got {type(objs).__name__}.")
    return tuple(as_message(m) for m in objs)
