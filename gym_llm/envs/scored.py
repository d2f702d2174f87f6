"""The single-turn scored-reply env: a task, one reply, a grade. What most verifiable-reward envs are.

An env of this kind is a task loader and a grade function::

    def grade(reply: str, task: Task) -> Grade: ...
    def build(*, my_args..., **common) -> EnvParts:
        return scored_reply_parts(load_my_tasks(my_args...), grade, **common)

:func:`scored_reply_parts` adds what every such env shares — ``format_reward``, a user's shaping ``reward_fn`` under a
deadline, tools, the task order and every :class:`~gym_llm.core.chat.ChatConfig` field — and the standard ``info``
keys (:class:`ScoredReplyHandler`). ``docs/adding_an_env.md`` walks through one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from gym_llm.core.chat import ChatConfig, ChatEpisode, Response
from gym_llm.core.episode import EnvParts
from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task, TaskOrder
from gym_llm.envs.common import chat_env_parts
from gym_llm.rewards.hooks import DEFAULT_HOOK_TIMEOUT_S, call_reward, check_hook, isolate_hook

__all__ = ["Grade", "GradeLike", "GradeFn", "ScoredReplyHandler", "scored_reply_parts"]


@dataclass(frozen=True, slots=True)
class Grade:
    """What a grade function returns.

    Attributes:
        correct: the reply is right (``info["correct"]``).
        formatted: the reply states its answer the way the prompt asks (``info["formatted"]``; earns
            ``format_reward``).
        extracted: the answer read from the reply, "" when none (``info["extracted_answer"]``).
        reference: the reference answer (``info["reference_answer"]``).
        score: the task reward in [0, 1] when partial credit exists; None means ``float(correct)``.
        problem: why the answer was refused, if it was (``info["answer_problem"]``).
        error: grading could not finish (a deadline); the reply is graded wrong (``info["reward_error"]``).
    """

    correct: bool
    formatted: bool
    extracted: str
    reference: str
    score: float | None = None
    problem: str | None = None
    error: str | None = None


class GradeLike(Protocol):
    """Any object with :class:`Grade`'s first four attributes (e.g. :func:`gym_llm.rewards.gsm8k.grade`'s result);
    ``score``, ``problem`` and ``error`` are read when present."""

    correct: bool
    formatted: bool
    extracted: str | None
    reference: str


GradeFn = Callable[[str, Task], GradeLike]
"""``grade(reply_text, task) -> Grade``."""


class ScoredReplyHandler:
    """Scores the single assistant turn and ends the episode.

    ``reward = score + format_reward * formatted + reward_fn(task, messages)``, where ``score`` is the grade's
    ``score`` or ``float(correct)``, and the shaping hook ``reward_fn`` (if given) runs under ``reward_timeout_s``.
    ``info``: ``correct``, ``formatted``, ``extracted_answer``, ``reference_answer``, then ``score`` and
    ``answer_problem`` when the grade has them, ``reward_error`` when grading or the hook failed, and the hook's own
    info keys.
    """

    def __init__(self, grade: GradeFn, format_reward: float = 0.0, reward_fn: Any = None,
                 reward_timeout_s: float | None = DEFAULT_HOOK_TIMEOUT_S):
        check_hook(grade, "grade", "(reply_text, task) -> Grade")
        check_hook(reward_fn)
        self.grade = grade
        self.format_reward = float(format_reward)
        self.reward_fn = isolate_hook(reward_fn, reward_timeout_s)

    def respond(self, episode: ChatEpisode, reply: Message) -> Response:
        result = self.grade(reply.content, episode.task)
        score = getattr(result, "score", None)
        reward = (float(result.correct) if score is None else float(score)) + self.format_reward * float(result.formatted)
        info: dict[str, Any] = {
            "correct": bool(result.correct),
            "formatted": bool(result.formatted),
            "extracted_answer": result.extracted if result.extracted is not None else "",
            "reference_answer": result.reference,
        }
        if hasattr(result, "score"):
            info["score"] = float(result.correct) if score is None else float(score)
        if hasattr(result, "problem"):
            info["answer_problem"] = result.problem or ""
        if getattr(result, "error", None) is not None:
            info["reward_error"] = result.error
        if self.reward_fn is not None:
            shaping, extra = call_reward(self.reward_fn, episode.task, (*episode.messages, reply))
            reward += shaping
            info.update(extra)
        return Response(reward, True, (), info)


def scored_reply_parts(
    tasks: Sequence[Task],
    grade: GradeFn,
    *,
    format_reward: float = 0.0,
    reward_fn: Any = None,
    reward_timeout_s: float | None = DEFAULT_HOOK_TIMEOUT_S,
    task_order: TaskOrder = "shuffle",
    tools: Sequence[Any] | None = None,
    max_tool_calls_per_turn: int = 8,
    **chat_kwargs: Any,
) -> EnvParts:
    """The env parts of a single-turn scored-reply env: ``tasks`` answered once, scored by ``grade``.

    Args:
        tasks: the task source (see :class:`~gym_llm.core.tasks.Task`).
        grade: ``grade(reply_text, task) -> Grade``.
        format_reward: added when the grade says ``formatted``.
        reward_fn: a shaping hook ``reward_fn(task, messages) -> float | (float, info)``, run in a worker process
            under ``reward_timeout_s`` (None: inline, no deadline).
        task_order: ``"shuffle"`` (a seeded permutation per epoch) or ``"sequential"`` (the source's order, starting
            at a seeded offset; ``options={"task_id": i}`` or the vector env's ``task_assignment="partition"`` walk
            it from wherever you choose).
        tools, max_tool_calls_per_turn: tools whose calls in a reply are answered before the final reply is scored
            (raise ``max_turns``).
        **chat_kwargs: every :class:`~gym_llm.core.chat.ChatConfig` field (``mode``, ``tokenizer``,
            ``system_prompt``, ``max_turns``, ...).
    """
    handler = ScoredReplyHandler(grade, format_reward, reward_fn, reward_timeout_s)
    return chat_env_parts(list(tasks), handler, ChatConfig(**chat_kwargs), task_order=task_order, tools=tools,
                          max_tool_calls_per_turn=max_tool_calls_per_turn)
