"""MCPTool against a real MCP server over stdio (tests/tools/mcp_server.py), alone and in chat envs."""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from pathlib import Path

import pytest

from gym_llm.envs.chat import LLMChatEnv
from gym_llm.tools import MCPTool, PythonTool, ToolCall

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def process_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def mcp_tool():
    tool = MCPTool(sys.executable, [SERVER], name_prefix="srv_", timeout_s=2.0)
    tool.attach()
    yield tool
    tool.detach()


def test_lists_tools_as_function_schemas(mcp_tool):
    assert mcp_tool.names == ("srv_add", "srv_shout", "srv_fail", "srv_sleep", "srv_pid", "srv_crash")
    add = mcp_tool.schemas()[0]
    assert add["type"] == "function" and add["function"]["name"] == "srv_add"
    assert add["function"]["description"] == "Add two integers."
    assert add["function"]["parameters"]["required"] == ["a", "b"]


def test_calls_results_and_errors(mcp_tool):
    ok = mcp_tool.run(ToolCall("srv_add", {"a": 2, "b": 40}))
    assert (ok.status, ok.content) == ("ok", "42")
    bad = mcp_tool.run(ToolCall("srv_add", {"a": "two", "b": 1}))
    assert bad.status == "error" and bad.content.startswith("Error") and "integer" in bad.content
    failed = mcp_tool.run(ToolCall("srv_fail", {"message": "boom"}))
    assert failed.status == "error" and "boom" in failed.content
    slow = mcp_tool.run(ToolCall("srv_sleep", {"seconds": 10}))
    assert slow.status == "timeout" and "2 s" in slow.content
    assert mcp_tool.run(ToolCall("srv_shout", {"text": "still up"})).content == "STILL UP"


def test_a_dead_server_is_an_error_then_restarted(mcp_tool):
    first_pid = int(mcp_tool.run(ToolCall("srv_pid", {})).content)
    crashed = mcp_tool.run(ToolCall("srv_crash", {}))
    assert crashed.status == "crashed" and crashed.content.startswith("Error: calling srv_crash failed")
    second_pid = int(mcp_tool.run(ToolCall("srv_pid", {})).content)
    assert second_pid != first_pid and process_gone(first_pid)


def test_pickles_as_a_spec():
    tool = MCPTool(sys.executable, [SERVER], include=["add"])
    clone = pickle.loads(pickle.dumps(tool))
    assert clone.command == sys.executable and clone._connection is None and clone.names == ()


def test_chat_env_mixes_python_and_mcp_tools_and_closes_the_server():
    tools = [PythonTool(min_idle=0), MCPTool(sys.executable, [SERVER], name_prefix="srv_", include=["add", "pid"])]
    env = LLMChatEnv(prompts=["Add 2 and 40, then square it."], tools=tools, max_turns=4)
    obs, _ = env.reset(seed=0)
    assert '"name": "srv_add"' in obs and '"name": "python"' in obs and "<tools>" in obs  # schemas in the prompt
    reply = ('<tool_call>{"name": "srv_add", "arguments": {"a": 2, "b": 40}, "id": "call_1"}</tool_call>\n'
             "```python\nprint(42 ** 2)\n```\n"
             '<tool_call>{"name": "srv_pid", "arguments": {}}</tool_call>\n'
             '<tool_call>{"name": "srv_shout", "arguments": {"text": "x"}}</tool_call>')
    obs, reward, terminated, truncated, info = env.step(reply)
    assert not (terminated or truncated)
    messages = env.unwrapped.episode.messages[-4:]
    assert [(m.role, m.name) for m in messages] == [("tool", "srv_add"), ("tool", "python"), ("tool", "srv_pid"),
                                                    ("tool", "srv_shout")]
    assert messages[0].content == "42" and messages[0].tool_call_id == "call_1" and messages[1].content == "1764\n"
    assert "unknown tool 'srv_shout'" in messages[3].content  # excluded by include=
    assert [c["status"] for c in json.loads(info["tool_calls"])] == ["ok", "ok", "ok", "invalid"]
    assert obs.endswith("<|im_start|>assistant\n") and "<|im_start|>tool\n1764\n<|im_end|>" in obs
    server_pid = int(messages[2].content)
    env.close()
    assert process_gone(server_pid)
    assert tools[0]._pool is None and tools[1]._connection is None


def test_server_that_does_not_start_fails_env_construction():
    broken = MCPTool(sys.executable, ["-c", "import sys; sys.exit(1)"], startup_timeout_s=10)
    with pytest.raises(Exception):
        LLMChatEnv(prompts=["hi"], tools=[broken])
    assert broken._connection is None and broken._refs == 0
    assert os.path.exists(SERVER)


def test_forked_child_starts_its_own_server(mcp_tool):
    """AsyncVectorEnv's fork workers inherit attached tools: they must not use the parent's connection."""
    parent_server = int(mcp_tool.run(ToolCall("srv_pid", {})).content)
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            mcp_tool.attach()
            result = mcp_tool.run(ToolCall("srv_pid", {}))
            mcp_tool.detach()
            os.write(write_fd, f"{result.status} {result.content}".encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    status, server = os.read(read_fd, 1024).decode().split()
    os.close(read_fd)
    os.waitpid(child, 0)
    assert status == "ok" and int(server) != parent_server
    assert int(mcp_tool.run(ToolCall("srv_pid", {})).content) == parent_server  # the parent's is untouched
