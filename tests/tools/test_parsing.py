"""Parsing tool calls from assistant messages: both formats, order, and malformed calls."""

from __future__ import annotations

import pytest

from gym_llm.tools import ToolCall, parse_tool_calls


def test_hermes_tool_call_with_object_and_string_arguments():
    text = ('First <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "c1"}\n</tool_call> then '
            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3}"}</tool_call> and '
            '<tool_call>{"name": "noargs"}</tool_call> <tool_call>{"name": "p", "parameters": {"x": 1}}</tool_call>')
    calls = parse_tool_calls(text)
    assert calls == [
        ToolCall("add", {"a": 1, "b": 2}, "c1"),
        ToolCall("add", {"a": 3}),
        ToolCall("noargs", {}),
        ToolCall("p", {"x": 1}),
    ]


def test_code_blocks_only_when_a_tool_takes_them():
    text = "Compute:\n```python\nx = 1\nprint(x)\n```\nand\n  ```py\n  y = 2\n  ```\n```bash\nls\n```\n"
    assert parse_tool_calls(text) == []
    calls = parse_tool_calls(text, code_block_tool="python")
    assert [c.arguments["code"] for c in calls] == ["x = 1\nprint(x)\n", "y = 2\n"]  # dedented
    assert all(c.name == "python" and c.format == "code_block" and c.error is None for c in calls)


def test_calls_come_in_order_of_appearance_and_fences_inside_json_are_not_blocks():
    text = ('```python\na = 1\n```\n<tool_call>{"name": "python", "arguments": {"code": "```python\\nb\\n```"}}'
            '</tool_call>\n```python\nc = 3\n```')
    calls = parse_tool_calls(text, code_block_tool="python")
    assert [(c.format, c.arguments["code"]) for c in calls] == [
        ("code_block", "a = 1\n"), ("tool_call", "```python\nb\n```"), ("code_block", "c = 3\n")]


@pytest.mark.parametrize("text, needle", [
    ('<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>', "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
    ('<tool_call>["add"]</tool_call>', 'no "name"'),
    ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "add", "arguments": "{oops"}</tool_call>', "not valid JSON"),
    ('<tool_call>{"name": "add", "arguments": {}}', "not closed"),
    ("```python\nprint(1)\n", "not closed"),
])
def test_malformed_calls_carry_an_error(text, needle):
    [call] = parse_tool_calls(text, code_block_tool="python")
    assert call.error is not None and needle in call.error


def test_plain_text_has_no_calls():
    assert parse_tool_calls("The answer is 42.\n#### 42", code_block_tool="python") == []
    assert parse_tool_calls("Inline `python` and ``` fences ``` are not blocks.", code_block_tool="python") == []
