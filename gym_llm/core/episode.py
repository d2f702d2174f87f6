"""The episode state machine shared by every scalar env and its native vector twin.

An env id is an :class:`EnvParts`: a task source, the observation/action spaces, and a factory of
:class:`Episode` objects. :class:`gym_llm.core.env.LLMEnv` drives one episode;
:class:`gym_llm.core.vector.LLMVectorEnv` drives ``num_envs`` of them. Both call the same three phases
per step, so the scalar and vector envs cannot drift apart:

1. ``check_action(action)`` — validate and normalise; raises on bad input and changes nothing;
2. ``respond(action)`` — the possibly slow part (scoring, tools, a user simulator); reads state but
   does not change it, so a vector env may run it for all sub-envs in parallel threads;
3. ``advance(action, response)`` — apply the turn and return the :class:`Transition`.
"""

from __future__ import annotations

import abc
import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from gymnasium import spaces

from gym_llm.core.tasks import Task, TaskOrder

__all__ = ["Episode", "EnvParts", "ForkError", "Transition", "fork_resource", "make_all"]


@dataclass(slots=True)
class Transition:
    """The result of one step of one episode."""

    observation: Any
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class ForkError(NotImplementedError):
    """An episode (or one of its resources: a tool session, a workspace) cannot be forked; the message says which
    and why. Nothing was changed: the episode being forked goes on as before."""


def make_all(count: int, make: Callable[[], Any]) -> list[Any]:
    """``[make() for _ in range(count)]``, all or none: if one call raises, the objects already made are closed
    (``close()``) and the error goes on. How ``k`` forks are made without leaking the first ones when one fails."""
    made: list[Any] = []
    try:
        for _ in range(count):
            made.append(make())
    except BaseException:
        for obj in made:
            obj.close()
        raise
    return made


_PLAIN = (str, bytes, int, float, complex, bool, type(None))


def fork_resource(value: Any, where: str) -> Any:
    """A copy of one of an episode's resources for a forked sibling: objects with a ``fork()`` method are forked
    (tool sessions), plain data (numbers, strings, containers of them, numpy arrays) is deep-copied, anything else
    is refused with a :class:`ForkError` naming ``where`` (e.g. ``"resource 'gym_llm.tools'"``)."""
    if isinstance(value, _PLAIN):
        return value
    fork = getattr(value, "fork", None)
    if callable(fork):
        return fork()
    if isinstance(value, dict):
        return {key: fork_resource(item, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [fork_resource(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a namedtuple takes *items
    if type(value).__module__ == "numpy":
        return copy.deepcopy(value)
    raise ForkError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which has no fork() method: "
                    "an episode holding it cannot be forked. Give the class a fork() that returns an independent copy "
                    "(or raises ForkError saying why it cannot).")


class Episode(abc.ABC):
    """One sub-environment's episode. Subclasses keep all per-episode state here."""

    task: Task | None = None

    @abc.abstractmethod
    def start(self, task: Task) -> tuple[Any, dict[str, Any]]:
        """Begin an episode on ``task``; return the first observation and info."""

    @abc.abstractmethod
    def check_action(self, action: Any) -> Any:
        """Validate ``action``; return it normalised. Raise ``TypeError``/``ValueError`` on bad input."""

    def respond(self, action: Any) -> Any:
        """Compute the env's response to a checked action without changing state (default: nothing)."""
        return None

    @abc.abstractmethod
    def advance(self, action: Any, response: Any) -> Transition:
        """Apply a checked action and its response; return the transition."""

    def render(self) -> str:
        """A human-readable view of the episode so far."""
        return ""

    def close(self) -> None:
        """Release per-episode resources (e.g. a sandbox)."""

    def fork(self) -> "Episode":
        """An independent copy of this episode at its current step: the sibling shares the past (task, history,
        buffers, resources such as a tool's live state) and diverges from here; stepping either never changes the
        other, and closing either leaves the other working. Raises :class:`ForkError` when the episode (or one of
        its resources) cannot be copied; the episode is then unchanged."""
        raise ForkError(f"{type(self).__qualname__} episodes cannot be forked (the class defines no fork()).")


@dataclass(kw_only=True)
class EnvParts:
    """What an env id is made of; built once and shared by all sub-envs of a vector env.

    Attributes:
        tasks: the task source (indexable; ``tasks[i].task_id == i``).
        new_episode: builds a fresh :class:`Episode`.
        observation_space / action_space: the single-env spaces.
        task_order: how episodes walk the task source (see :class:`gym_llm.core.tasks.TaskStream`).
        parallel_respond: whether ``Episode.respond`` is slow enough to be worth a thread pool in the
            vector env (tools, heavy verifiers). Fast scorers run inline.
        on_close: called once when the env closes (shared pools, servers).
        respond_workers: the vector env's default ``num_workers`` when the env knows better than
            ``parallel_respond`` does: an int, or ``"per_env"`` (one thread per sub-env: tools that wait).
        on_vector: called with ``num_envs`` once a vector env is built over this parts (e.g. to start that
            many sandboxes ahead of the first reset).
    """

    tasks: Sequence[Task]
    new_episode: Callable[[], Episode]
    observation_space: spaces.Space
    action_space: spaces.Space
    task_order: TaskOrder = "shuffle"
    parallel_respond: bool = False
    on_close: Callable[[], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    respond_workers: int | str | None = None
    on_vector: Callable[[int], None] | None = None

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()
            self.on_close = None


def resolve_reset_task(tasks: Sequence[Task], options: dict[str, Any] | None) -> Task | None:
    """The task forced by ``reset(options=...)``, or ``None`` to draw from the stream.

    Accepted options: ``{"task_id": int}`` (an index into the task source) or ``{"task": Task}``.
    """
    if options is None:
        return None
    if not isinstance(options, dict):
        raise TypeError(f"reset(options=...) must be a dict or None, got {type(options).__name__}.")
    unknown = set(options) - {"task_id", "task", "reset_mask"}
    if unknown:
        raise ValueError(
            f"Unknown reset option(s) {sorted(unknown)}; accepted: 'task_id' (int index into the task "
            "source) or 'task' (a gym_llm Task); vector envs also take 'task_ids' (one index per sub-env) and "
            "'reset_mask'."
        )
    if "task_id" in options and "task" in options:
        raise ValueError("Pass either options['task_id'] or options['task'], not both.")
    if "task" in options:
        task = options["task"]
        if not isinstance(task, Task):
            raise TypeError(
                f"options['task'] must be a gym_llm.core.tasks.Task, got {type(task).__name__}; "
                "to pick a task by index use options={'task_id': i}."
            )
        return task
    if "task_id" in options:
        index = options["task_id"]
        if isinstance(index, bool) or not isinstance(index, int) and not hasattr(index, "__index__"):
            raise TypeError(f"options['task_id'] must be an int, got {type(index).__name__}.")
        index = int(index)
        if not 0 <= index < len(tasks):
            raise ValueError(f"options['task_id'] must be in [0, {len(tasks)}), got {index}.")
        return tasks[index]
    return None
