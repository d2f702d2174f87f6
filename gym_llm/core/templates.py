"""Chat templates: rendering a conversation to the text a model sees, and rendering only what is new.

Two renderers share one interface (:class:`ChatRenderer`):

* the tokenizer's own template, through ``tokenizer.apply_chat_template(..., tokenize=False)``
  (any object with that method: a Hugging Face tokenizer, or your own);
* a jinja2 template string — the ``chat_template=`` argument, or the built-in ChatML template
  :data:`CHATML_TEMPLATE` when there is no tokenizer or it has no template of its own.

:meth:`ChatRenderer.render_continuation` is what keeps multi-turn token sequences exact: it renders only
the messages the env adds after an assistant turn, against a fixed dummy history, so the assistant's
sampled tokens are never re-rendered or re-tokenised — even when the template rewrites earlier turns
(for example Qwen3's template strips ``<think>`` blocks from history).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Mapping, Sequence

from gym_llm.core.messages import Message

__all__ = ["CHATML_TEMPLATE", "ChatRenderer", "TemplateError", "render_chatml"]

CHATML_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions. Their signatures are within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each call, return a JSON object with the function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages and messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if not (loop.first and message.role == 'system') %}
{{- '<|im_start|>' + message.role + '\\n' + message.content }}
{%- if message.role == 'assistant' and message.tool_calls and '<tool_call>' not in message.content %}
{%- for call in message.tool_calls %}
{{- '\\n<tool_call>\\n' + ({'name': call.function.name, 'arguments': call.function.arguments} | tojson) + '\\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
"""The built-in ChatML template (``<|im_start|>role\\ncontent<|im_end|>\\n``), with a Hermes-style
``<tools>`` system section when tools are given. Used when no tokenizer template is available."""


_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions. Their signatures are within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each call, return a JSON object with the function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)


def render_chatml(
    messages: Sequence[Message], *, add_generation_prompt: bool, tools: Sequence[Mapping[str, Any]] | None = None
) -> str:
    """:data:`CHATML_TEMPLATE` rendered in plain Python — the same text, ~50x faster than jinja's
    sandbox (the env renders on every text-mode turn; ``tests/core/test_templates.py`` checks the two
    agree on random conversations)."""
    parts: list[str] = []
    start = 0
    if tools:
        parts.append("<|im_start|>system\n")
        if messages and messages[0].role == "system":
            parts.append(messages[0].content + "\n\n")
        parts.append(_TOOLS_HEADER)
        parts.extend("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
        parts.append(_TOOLS_FOOTER)
    elif messages and messages[0].role == "system":
        parts.append("<|im_start|>system\n" + messages[0].content + "<|im_end|>\n")
    if messages and messages[0].role == "system":
        start = 1
    for message in messages[start:]:
        parts.append("<|im_start|>" + message.role + "\n" + message.content)
        if message.role == "assistant" and message.tool_calls and "<tool_call>" not in message.content:
            for call in message.tool_calls:
                function = call["function"]
                payload = {"name": function["name"], "arguments": function["arguments"]}
                parts.append("\n<tool_call>\n" + json.dumps(payload, ensure_ascii=False) + "\n</tool_call>")
        parts.append("<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class TemplateError(ValueError):
    """A chat template cannot render what the env needs (e.g. it rewrites the turns it is given)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(f"The chat template raised: {message}")


@lru_cache(maxsize=32)
def _compile(source: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    # Hugging Face templates expect json.dumps semantics (jinja's own tojson HTML-escapes).
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, **_: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii
    )
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source)


_DUMMY_USER = "Hello."
_DUMMY_ASSISTANT = "\u2063gym-llm-dummy-reply\u2063"


class ChatRenderer:
    """Renders conversations with one chat template.

    Args:
        tokenizer: an object with ``apply_chat_template`` (used when it has a template and no
            ``chat_template`` string is given). Its ``bos_token``/``eos_token`` feed string templates.
        chat_template: a jinja2 template string; overrides the tokenizer's template.
        template_kwargs: extra variables for the template (e.g. ``{"enable_thinking": False}``).
        tools: JSON tool schemas passed to the template's ``tools`` variable.
    """

    def __init__(
        self,
        tokenizer: Any = None,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.tools = [dict(t) for t in tools] if tools else None
        use_tokenizer = (
            chat_template is None
            and tokenizer is not None
            and hasattr(tokenizer, "apply_chat_template")
            and bool(getattr(tokenizer, "chat_template", True))
        )
        source = chat_template or (getattr(tokenizer, "chat_template", None) if use_tokenizer else None) or CHATML_TEMPLATE
        # The built-in ChatML template (ours, or a tokenizer that carries it) renders in plain Python.
        self._fast_chatml = source == CHATML_TEMPLATE
        self._tokenizer_template = use_tokenizer and not self._fast_chatml
        self._template = None if (self._tokenizer_template or self._fast_chatml) else _compile(source)
        self._specials = {
            "bos_token": getattr(tokenizer, "bos_token", None) or "",
            "eos_token": getattr(tokenizer, "eos_token", None) or "",
        }
        self._closing: str | None = None
        self._prefix_cache: dict[tuple[Message, ...], str] = {}

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        """The conversation as the model sees it; with ``add_generation_prompt`` it ends where the
        assistant's reply starts."""
        if self._fast_chatml:
            return render_chatml(messages, add_generation_prompt=add_generation_prompt, tools=self.tools)
        dicts = [m.to_dict() for m in messages]
        if self._tokenizer_template:
            kwargs = dict(self.template_kwargs)
            if self.tools:
                kwargs["tools"] = self.tools
            text = self.tokenizer.apply_chat_template(
                dicts, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
            )
            if not isinstance(text, str):
                raise TemplateError(
                    f"tokenizer.apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str."
                )
            return text
        return self._template.render(
            messages=dicts,
            add_generation_prompt=add_generation_prompt,
            tools=self.tools,
            **self._specials,
            **self.template_kwargs,
        )

    def _dummy_history(self, system: Message | None) -> tuple[Message, ...]:
        head = (system,) if system is not None else ()
        return (*head, Message("user", _DUMMY_USER), Message("assistant", _DUMMY_ASSISTANT))

    @property
    def closing(self) -> str:
        """The text the template puts after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
        if self._closing is None:
            text = self.render(self._dummy_history(None), add_generation_prompt=False)
            at = text.rfind(_DUMMY_ASSISTANT)
            if at < 0:
                raise TemplateError(
                    "The chat template dropped the assistant's content when it was the last message; "
                    "gym-llm cannot find where an assistant turn ends. Pass chat_template= with a template "
                    "that renders assistant messages."
                )
            self._closing = text[at + len(_DUMMY_ASSISTANT):]
        return self._closing

    def render_continuation(
        self, new_messages: Sequence[Message], *, system: Message | None, add_generation_prompt: bool = True
    ) -> str:
        """The text that the template adds after a finished assistant turn for ``new_messages``.

        Rendered against a fixed dummy history (``[system], user, assistant``) so the real history —
        and the tokens the policy sampled — are never rendered again. The assistant turn's own
        closing (:attr:`closing`) is *not* included: the caller adds whatever part of it the policy
        did not sample.

        Raises:
            TemplateError: the template does not render the history identically once messages are
                appended (it rewrites earlier turns in a way that cannot be applied incrementally).
        """
        history = self._dummy_history(system)
        prefix = self._prefix_cache.get(history)
        if prefix is None:
            prefix = self.render(history, add_generation_prompt=False)
            self._prefix_cache[history] = prefix
        full = self.render((*history, *new_messages), add_generation_prompt=add_generation_prompt)
        if not full.startswith(prefix):
            raise TemplateError(
                "The chat template renders a conversation's earlier turns differently once new messages "
                f"({[m.role for m in new_messages]}) are appended, so they cannot be appended as new tokens. "
                "Use a template that renders each turn independently of later ones, or pass chat_template=."
            )
        return full[len(prefix):]
