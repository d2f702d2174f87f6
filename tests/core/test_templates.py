"""Chat templates: the Python ChatML renderer equals the jinja template; continuation rendering."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gym_llm.core.messages import Message
from gym_llm.core.templates import CHATML_TEMPLATE, ChatRenderer, TemplateError, _compile, render_chatml

TOOLS = [{"type": "function", "function": {"name": "python", "description": "Run code ✓",
                                           "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}]
CALL = {"type": "function", "function": {"name": "python", "arguments": {"code": "print('é')"}}}

roles = st.sampled_from(["user", "assistant", "tool"])
message = st.builds(lambda role, content, call: Message(role, content, tool_calls=(CALL,) if call and role == "assistant" else ()),
                    roles, st.text(max_size=30), st.booleans())


@settings(max_examples=200)
@given(system=st.one_of(st.none(), st.text(max_size=20)), messages=st.lists(message, max_size=6),
       gen=st.booleans(), tools=st.booleans())
def test_python_chatml_equals_jinja(system, messages, gen, tools):
    msgs = ([Message("system", system)] if system is not None else []) + messages
    dicts = [m.to_dict() for m in msgs]
    expected = _compile(CHATML_TEMPLATE).render(messages=dicts, add_generation_prompt=gen, tools=TOOLS if tools else None)
    assert render_chatml(msgs, add_generation_prompt=gen, tools=TOOLS if tools else None) == expected


def test_closing_and_continuation():
    r = ChatRenderer()
    assert r.closing == "<|im_end|>\n"
    text = r.render_continuation([Message("user", "next")], system=Message("system", "S"))
    assert text == "<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
    assert r.render_continuation([Message("tool", "42")], system=None, add_generation_prompt=False) == (
        "<|im_start|>tool\n42<|im_end|>\n")


def test_template_that_rewrites_history_on_append_is_rejected():
    # renders the assistant's content only when it is the last message
    bad = ("{% for m in messages %}{% if m.role != 'assistant' or loop.last %}{{ m.role }}:{{ m.content }}\n"
           "{% else %}{{ m.role }}:(hidden)\n{% endif %}{% endfor %}")
    r = ChatRenderer(chat_template=bad)
    with pytest.raises(TemplateError, match="cannot be appended as new tokens"):
        r.render_continuation([Message("user", "next")], system=None)


def test_template_raise_exception_is_a_template_error():
    r = ChatRenderer(chat_template="{{ raise_exception('only user messages') }}")
    with pytest.raises(TemplateError, match="only user messages"):
        r.render([Message("user", "x")], add_generation_prompt=True)
