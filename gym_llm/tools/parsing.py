"""Parsing tool calls out of an assistant message.

Two formats, in order of appearance in the message:

* Hermes/Qwen JSON tags: ``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>``
  (``arguments`` may also be a JSON-encoded string, OpenAI style; ``parameters`` is accepted as an alias).
* fenced code blocks: ```` ```python ```` (or ``py``/``python3``) … ```` ``` ```` — calls to the tool
  that takes code blocks (the Python tool), with ``{"code": <block>}``.

Malformed calls (bad JSON, no name, an unclosed tag or fence) come back as :class:`ToolCall` objects
with ``error`` set, so the env answers them with an error tool message instead of raising.
"""

from __future__ import annotations

import json
import re
import textwrap

from gym_llm.tools.base import ToolCall

__all__ = ["parse_tool_calls"]

_TAG = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_FENCE_OPEN = re.compile(r"^[ \t]*```[ \t]*(python3?|py)[ \t]*\r?\n", re.MULTILINE | re.IGNORECASE)
_FENCE_CLOSE = re.compile(r"^[ \t]*```[ \t]*$", re.MULTILINE)
_EXPECTED = 'expected <tool_call>{"name": "<function>", "arguments": {...}}</tool_call>'


def parse_tool_calls(text: str, *, code_block_tool: str | None = None) -> list[ToolCall]:
    """All tool calls in ``text``, in order.

    Args:
        text: the assistant message.
        code_block_tool: the function name fenced Python blocks call; ``None`` ignores code blocks.

    >>> [c.name for c in parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')]
    ['add']
    >>> parse_tool_calls("Let me compute.\\n```python\\nprint(6 * 7)\\n```", code_block_tool="python")[0].arguments
    {'code': 'print(6 * 7)\\n'}
    """
    found: list[tuple[int, ToolCall]] = []
    masked = list(text)
    for match in _TAG.finditer(text):
        found.append((match.start(), _json_call(match.group(1), closed=bool(match.group(2)))))
        masked[match.start():match.end()] = " " * (match.end() - match.start())
    if code_block_tool is not None:
        found.extend(_code_blocks("".join(masked), code_block_tool))
    found.sort(key=lambda item: item[0])
    return [call for _, call in found]


def _json_call(body: str, *, closed: bool) -> ToolCall:
    if not closed:
        return ToolCall("", error=f"the <tool_call> tag is not closed; {_EXPECTED}.")
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall("", error=f"the <tool_call> body is not valid JSON ({e}); {_EXPECTED}.")
    except RecursionError:  # model-written JSON nested deeper than the parser's stack
        return ToolCall("", error=f"the <tool_call> JSON is nested too deeply to parse; {_EXPECTED}.")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        return ToolCall("", error=f"the <tool_call> JSON has no \"name\" string; {_EXPECTED}.")
    name = payload["name"]
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON-encoded string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(name, error=f"the \"arguments\" string of {name!r} is not valid JSON ({e}).")
        except RecursionError:
            return ToolCall(name, error=f"the \"arguments\" string of {name!r} is nested too deeply to parse.")
    if not isinstance(arguments, dict):
        return ToolCall(name, error=f"\"arguments\" of {name!r} must be a JSON object, got {type(arguments).__name__}.")
    call_id = payload.get("id")
    return ToolCall(name, arguments, call_id if isinstance(call_id, str) else None)


def _code_blocks(text: str, tool: str) -> list[tuple[int, ToolCall]]:
    calls = []
    position = 0
    while (opening := _FENCE_OPEN.search(text, position)) is not None:
        closing = _FENCE_CLOSE.search(text, opening.end())
        if closing is None:
            calls.append((opening.start(), ToolCall(tool, {}, error="the ```python block is not closed with ```.",
                                                     format="code_block")))
            break
        code = textwrap.dedent(text[opening.end():closing.start()])
        calls.append((opening.start(), ToolCall(tool, {"code": code}, format="code_block")))
        position = closing.end()
    return calls
