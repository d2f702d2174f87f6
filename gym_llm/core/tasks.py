"""Tasks, task sources and the seeded order in which episodes draw them.

A *task* is what one episode is about: its opening messages, an optional reference answer and the raw
record it came from. A *task source* is any indexable sequence of tasks. A :class:`TaskStream` turns a
source and a seed into the deterministic sequence ``task(round)`` that an env walks through, one task
per episode. The native vector envs give every member of a GRPO group its own copy of the group's
stream, so member ``i`` of group ``g`` gets ``task(round)`` of that stream whatever order episodes
finish in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from gym_llm.core.messages import Message, as_messages

__all__ = ["TASK_SEED_BOUND", "Task", "TaskStream", "TaskOrder", "tasks_from_records"]

TASK_SEED_BOUND = 2**62
"""Task-stream seeds are drawn from ``np_random.integers(TASK_SEED_BOUND)`` right after seeding (scalar and vector
envs alike)."""

TaskOrder = Literal["shuffle", "sequential"]


@dataclass(frozen=True, slots=True)
class Task:
    """One episode's task.

    Attributes:
        task_id: the task's index in its source (stable for a given source).
        messages: the opening conversation, usually one user message (the env adds its system prompt).
        answer: the reference answer, when the task has one (GSM8K: the number after ``####``).
        data: the raw record the task came from (IFEval's ``kwargs``, scripted follow-ups, ...).
    """

    task_id: int
    messages: tuple[Message, ...]
    answer: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        """The text of the last opening message (the question)."""
        return self.messages[-1].content if self.messages else ""


def tasks_from_records(
    records: Sequence[Mapping[str, Any] | str],
    *,
    prompt_key: str | Sequence[str] = ("prompt", "question", "messages"),
    answer_key: str | None = "answer",
    answer_fn: Callable[[Mapping[str, Any]], str | None] | None = None,
) -> list[Task]:
    """Turn records into tasks.

    A record is a prompt string, or a mapping whose prompt lies under the first present key of
    ``prompt_key`` — a string (one user message) or a list of ``{"role", "content"}`` messages.

    Raises:
        ValueError: a record without any of the prompt keys, naming the record's index and its keys.
    """
    keys = (prompt_key,) if isinstance(prompt_key, str) else tuple(prompt_key)
    tasks = []
    for index, record in enumerate(records):
        if isinstance(record, str):
            tasks.append(Task(index, (Message("user", record),), None, {"prompt": record}))
            continue
        if not isinstance(record, Mapping):
            raise TypeError(
                f"Task record {index} must be a str or a mapping, got {type(record).__name__}."
            )
        key = next((k for k in keys if k in record), None)
        if key is None:
            raise ValueError(
                f"Task record {index} has none of the prompt keys {list(keys)}; its keys are "
                f"{sorted(record)}. Pass prompt_key= naming the field that holds the prompt."
            )
        prompt = record[key]
        if isinstance(prompt, str):
            messages: tuple[Message, ...] = (Message("user", prompt),)
        else:
            messages = as_messages(prompt)
        if answer_fn is not None:
            answer = answer_fn(record)
        elif answer_key is not None and record.get(answer_key) is not None:
            answer = str(record[answer_key])
        else:
            answer = None
        tasks.append(Task(index, messages, answer, record))
    return tasks


class TaskStream:
    """The deterministic sequence of tasks an env draws, one per episode ("round").

    ``order="shuffle"`` walks a fresh permutation of the source every epoch;
    ``order="sequential"`` walks it in order starting at a seeded offset. Either way
    ``task_index(round)`` depends only on ``(seed, round)``, so two streams with the same seed agree —
    which is what makes a GRPO group's members see the same task in the same round.

    Args:
        num_tasks: how many tasks the source holds (> 0).
        seed: the stream's seed (any non-negative int).
        order: ``"shuffle"`` (default) or ``"sequential"``.
    """

    __slots__ = ("num_tasks", "seed", "order", "_epoch", "_perm")

    def __init__(self, num_tasks: int, seed: int, order: TaskOrder = "shuffle"):
        if num_tasks <= 0:
            raise ValueError("TaskStream needs at least one task; the task source is empty.")
        if order not in ("shuffle", "sequential"):
            raise ValueError(f"task order must be 'shuffle' or 'sequential', got {order!r}.")
        self.num_tasks = num_tasks
        self.seed = seed
        self.order = order
        self._epoch = -1
        self._perm: np.ndarray | None = None

    def task_index(self, round_: int) -> int:
        """The source index of the task for episode number ``round_`` (0-based)."""
        epoch, offset = divmod(round_, self.num_tasks)
        if self.order == "sequential":
            start = self.seed % self.num_tasks
            return (start + round_) % self.num_tasks
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_tasks)
            self._epoch = epoch
        return self._perm.item(offset)  # type: ignore[union-attr]  # a Python int, without a numpy scalar
