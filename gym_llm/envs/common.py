"""Assembly shared by the chat-style env builders: config + task handler (+ tools) -> EnvParts."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from gym_llm.core.chat import ChatConfig, ChatCommon, TurnHandler
from gym_llm.core.episode import EnvParts
from gym_llm.core.tasks import Task, TaskOrder
from gym_llm.tools.handler import with_tools

__all__ = ["chat_env_parts", "take_arguments", "with_arguments_of"]


def chat_env_parts(
    tasks: Sequence[Task],
    handler: TurnHandler,
    config: ChatConfig,
    *,
    task_order: TaskOrder = "shuffle",
    tools: Sequence[Any] | None = None,
    max_tool_calls_per_turn: int = 8,
    parallel_respond: bool = False,
    on_close: Callable[[], None] | None = None,
    extra: dict[str, Any] | None = None,
) -> EnvParts:
    """An :class:`EnvParts` of chat episodes answered by ``handler``, with ``tools=[...]`` wired in.

    With tools, the handler is wrapped so tool calls are answered first (see
    :func:`gym_llm.tools.handler.with_tools`), their schemas reach the chat template, responses run in
    the vector env's thread pool, and closing the env stops the tools (then ``on_close``).
    """
    handler, tool_schemas, stop_tools = with_tools(handler, tools, max_turns=config.max_turns,
                                                   max_calls_per_turn=max_tool_calls_per_turn)
    try:
        common = ChatCommon(config, handler, tools=tool_schemas)
    except BaseException:
        if stop_tools is not None:
            stop_tools()
        raise

    def close() -> None:
        if stop_tools is not None:
            stop_tools()
        if on_close is not None:
            on_close()

    return EnvParts(
        tasks=tasks,
        new_episode=common.new_episode,
        observation_space=common.observation_space,
        action_space=common.action_space,
        task_order=task_order,
        parallel_respond=parallel_respond or stop_tools is not None,
        on_close=close if (stop_tools is not None or on_close is not None) else None,
        extra={"chat": common, **(extra or {})},
    )


def take_arguments(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop from ``kwargs`` the keyword arguments ``fn`` declares, and return them: how a builder hands each part of
    its arguments to the function that owns them (the task loader, then the builder) without listing them again.

    >>> def load(*, size=10, seed=0): ...
    >>> kwargs = {"size": 5, "format_reward": 0.1}
    >>> take_arguments(load, kwargs), kwargs
    ({'size': 5}, {'format_reward': 0.1})
    """
    names = [name for name, p in inspect.signature(fn).parameters.items()
             if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    return {name: kwargs.pop(name) for name in names if name in kwargs}


def with_arguments_of(*fns: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a ``builder(**kwargs)`` its own keyword arguments and those of the functions it forwards the rest to, as its
    signature
    (what ``help(Env)``, ``inspect.signature`` and the env class show): arguments are declared once, where they are
    used. Positional parameters of ``fns`` (the tasks, the grade function) are not the user's and are left out."""
    def decorate(builder: Callable[..., Any]) -> Callable[..., Any]:
        parameters: dict[str, inspect.Parameter] = {}
        var_keyword = None
        for fn in (builder, *fns):  # the builder's own arguments first
            for name, p in inspect.signature(fn).parameters.items():
                if p.kind is inspect.Parameter.VAR_KEYWORD:
                    var_keyword = var_keyword or p
                elif p.kind is inspect.Parameter.KEYWORD_ONLY or (
                        p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.default is not inspect.Parameter.empty):
                    parameters.setdefault(name, p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
        builder.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [*parameters.values(), *([var_keyword] if var_keyword else [])],
            return_annotation=inspect.signature(builder).return_annotation)
        return builder
    return decorate
