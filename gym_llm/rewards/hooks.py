"""One home for user reward hooks: checking them, running them under a deadline, and normalising what they return.

Every env that takes a ``reward_fn`` uses these: :func:`check_hook` when the env is made (a bad argument fails there,
naming what it expected), :func:`~gym_llm.rewards.deadline.isolate_hook` to run it in a killable worker, and
:func:`call_reward` at each scored turn.
"""

from __future__ import annotations

from typing import Any, Sequence

from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task
from gym_llm.rewards.deadline import DEFAULT_HOOK_TIMEOUT_S, DeadlineExceeded, isolate_hook

__all__ = ["DEFAULT_HOOK_TIMEOUT_S", "call_reward", "check_hook", "isolate_hook"]


def check_hook(value: Any, name: str = "reward_fn", signature: str = "(task, messages) -> float") -> None:
    """Raise ``TypeError`` unless ``value`` is None or callable, naming the argument and the expected call.

    >>> check_hook(len); check_hook(None)
    >>> check_hook(3.0)
    Traceback (most recent call last):
    ...
    TypeError: reward_fn must be callable(task, messages) -> float, got float.
    """
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable{signature}, got {type(value).__name__}.")


def call_reward(reward_fn: Any, task: Task, messages: Sequence[Message]) -> tuple[float, dict[str, Any]]:
    """Run a reward hook and normalise its result to ``(float, info)``: a hook returns a float, or
    ``(float, info_mapping)``. A hook under a deadline (what the envs make of every ``reward_fn``:
    :func:`~gym_llm.rewards.deadline.isolate_hook`) that runs past it gives ``(0.0, {"reward_error": ...})``."""
    if reward_fn is None:
        return 0.0, {}
    try:
        result = reward_fn(task, messages)
    except DeadlineExceeded as e:  # a hook past its limit: fail closed, and say so
        return 0.0, {"reward_error": f"DeadlineExceeded: {e}"}
    if isinstance(result, tuple):
        reward, info = result
        return float(reward), dict(info)
    return float(result), {}
