"""Assembly shared by the chat-style env builders: config + task handler (+ tools) -> EnvCore."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from gym_llm.core.chat import ChatConfig, ChatCore, TurnHandler
from gym_llm.core.episode import EnvCore
from gym_llm.core.tasks import Task, TaskOrder
from gym_llm.tools.handler import with_tools

__all__ = ["chat_env_core"]


def chat_env_core(
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
) -> EnvCore:
    """An :class:`EnvCore` of chat episodes answered by ``handler``, with ``tools=[...]`` wired in.

    With tools, the handler is wrapped so tool calls are answered first (see
    :func:`gym_llm.tools.handler.with_tools`), their schemas reach the chat template, responses run in
    the vector env's thread pool, and closing the env stops the tools (then ``on_close``).
    """
    handler, tool_schemas, stop_tools = with_tools(handler, tools, max_turns=config.max_turns,
                                                   max_calls_per_turn=max_tool_calls_per_turn)
    try:
        core = ChatCore(config, handler, tools=tool_schemas)
    except BaseException:
        if stop_tools is not None:
            stop_tools()
        raise

    def close() -> None:
        if stop_tools is not None:
            stop_tools()
        if on_close is not None:
            on_close()

    return EnvCore(
        tasks=tasks,
        new_episode=core.new_episode,
        observation_space=core.observation_space,
        action_space=core.action_space,
        task_order=task_order,
        parallel_respond=parallel_respond or stop_tools is not None,
        on_close=close if (stop_tools is not None or on_close is not None) else None,
        extra={"chat": core, **(extra or {})},
    )
