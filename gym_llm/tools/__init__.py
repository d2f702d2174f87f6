"""Tools for chat envs: a sandboxed persistent Python interpreter, MCP servers, a headless browser, and the glue.

``import gym_llm.tools`` is light: the sandbox, pyseccomp, the ``mcp`` client and Playwright load only
when a tool is built or attached. See ``docs/tools.md`` and ``docs/browser.md``.

>>> from gym_llm.tools import parse_tool_calls
>>> parse_tool_calls("```python\\nprint(1)\\n```", code_block_tool="python")[0].name
'python'
"""

from __future__ import annotations

from typing import Any

from gym_llm.tools.base import Tool, ToolCall, ToolResult, ToolSession, ToolStatus, function_schema
from gym_llm.tools.parsing import parse_tool_calls

__all__ = ["BrowserConfig", "BrowserTool", "MCPTool", "PythonTool", "SandboxConfig", "Tool", "ToolCall", "ToolHandler",
           "ToolResult", "ToolSession", "ToolStatus", "Toolbox", "function_schema", "parse_tool_calls"]

_LAZY = {
    "BrowserTool": "gym_llm.tools.browser",
    "BrowserConfig": "gym_llm.tools.browser",
    "PythonTool": "gym_llm.tools.python",
    "SandboxConfig": "gym_llm.tools.sandbox.config",
    "MCPTool": "gym_llm.tools.mcp",
    "ToolHandler": "gym_llm.tools.handler",
    "Toolbox": "gym_llm.tools.handler",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gym_llm.tools' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
