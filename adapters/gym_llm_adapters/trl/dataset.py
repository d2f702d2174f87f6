"""Prompt datasets for TRL's trainers, built from a gym_llm env's own tasks.

:func:`env_dataset` makes a ``datasets.Dataset`` whose rows are the episodes a scalar env serves after
``reset(seed=seed)``: row ``r`` is round ``r`` of the env's seeded task stream (so one epoch of ``num_tasks``
rows holds every task once). Each row's ``prompt`` is the episode's opening conversation exactly as the env
starts it (the env's system prompt, then the task's messages), in TRL's conversational format, so TRL's
chat templating renders what the env would render (tools aside: the env also passes its tools' schemas to
the template). The metadata columns let reward functions score a completion without the env
(:mod:`gym_llm_adapters.trl.rewards`) and let :class:`~gym_llm_adapters.trl.rollout.EnvRolloutFunc` map a
prompt back to its task.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping

from gym_llm.core.chat import ChatCommon
from gym_llm.core.tasks import Task

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["env_dataset", "chat_common", "prompt_messages", "task_columns"]

logger = logging.getLogger(__name__)


def chat_common(env: Any) -> ChatCommon:
    """The :class:`~gym_llm.core.chat.ChatCommon` of a gym_llm chat env (scalar or vector, wrapped or not).

    Raises:
        TypeError: the env is not a gym_llm chat-style env (token-level envs such as ``LLMTokens-v0`` and
            ``LLMHashing-v0`` have no conversation to train on with TRL).
    """
    parts = getattr(getattr(env, "unwrapped", env), "parts", None)
    chat = getattr(parts, "extra", {}).get("chat") if parts is not None else None
    if not isinstance(chat, ChatCommon):
        raise TypeError(
            f"The TRL integration needs a gym_llm chat env (LLMChat-v0, LLMGSM8K-v0, LLMIFEval-v0, LLMPythonTool-v0, "
            f"LLMBrowser-v0, or your own env built on gym_llm.core.chat); got {type(getattr(env, 'unwrapped', env)).__name__}, "
            "which is not one."
        )
    return chat


def prompt_messages(chat: ChatCommon, task: Task) -> list[dict[str, Any]]:
    """The opening conversation the env starts ``task`` with, as TRL's conversational prompt."""
    return [message.to_dict() for message in chat.opening(task)]


def task_columns(task: Task) -> dict[str, Any]:
    """The default metadata columns of a task besides ``task_id``, ``seed`` and ``round``.

    * ``answer``: the reference answer (``""`` when the task has none), e.g. GSM8K's final number;
    * IFEval tasks also get ``instruction_id_list`` (list of str) and ``instruction_kwargs`` (a JSON list
      with one dict per instruction: Arrow cannot store dicts whose keys vary from row to row).
    """
    out: dict[str, Any] = {"answer": task.answer if task.answer is not None else ""}
    data = task.data
    if isinstance(data, Mapping) and "instruction_id_list" in data and "kwargs" in data:
        out["instruction_id_list"] = [str(i) for i in data["instruction_id_list"]]
        out["instruction_kwargs"] = json.dumps(list(data["kwargs"]), sort_keys=True)
    return out


def env_dataset(
    env_id: str,
    *,
    num_rows: int | None = None,
    seed: int = 0,
    extra_columns: Callable[[Task], Mapping[str, Any]] | None = None,
    **env_kwargs: Any,
) -> "Dataset":
    """A ``datasets.Dataset`` of the env's prompts with their metadata, in the env's own episode order.

    Args:
        env_id: a registered gym_llm chat env id (``"LLMGSM8K-v0"``, ``"LLMIFEval-v0"``, ``"LLMPythonTool-v0"``, ...).
        num_rows: rows to make (default: the number of tasks, i.e. one epoch: every task once). More rows
            than tasks continue into the next epochs of the stream.
        seed: the reset seed: row ``r`` is the task a scalar env made with ``env_kwargs`` serves at round
            ``r`` after ``reset(seed=seed)``.
        extra_columns: ``task -> {column: value}`` for more metadata columns (values of one type per column).
        **env_kwargs: the env's arguments (``data_files=``, ``source=``, ``system_prompt=``, ...). Pass the same
            ones to :class:`~gym_llm_adapters.trl.rollout.EnvRolloutFunc` so both use the same task source.

    Returns:
        A ``Dataset`` with columns ``prompt`` (list of ``{"role", "content"}``), ``task_id`` (int, index in the
        env's task source), ``answer`` (str), ``seed`` (int), ``round`` (int), plus the columns of
        :func:`task_columns` and ``extra_columns``.

    Raises:
        TypeError: ``env_id`` is not a chat env.
        ValueError: ``num_rows < 1``, or ``extra_columns`` returns a reserved column name.
    """
    import gymnasium as gym
    from datasets import Dataset

    import gym_llm  # noqa: F401  (registers the ids)

    if num_rows is not None and (isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1):
        raise ValueError(f"num_rows must be an int >= 1 or None (one epoch), got {num_rows!r}.")
    env = gym.make(env_id, disable_env_checker=True, **env_kwargs)
    try:
        chat = chat_common(env)
        rows: list[dict[str, Any]] = []
        total = len(env.unwrapped.parts.tasks) if num_rows is None else num_rows
        for round_ in range(total):
            _, info = env.reset(seed=seed) if round_ == 0 else env.reset()
            task = env.unwrapped.episode.task
            assert task.task_id == info["task_id"] and info["round"] == round_
            row = {"prompt": prompt_messages(chat, task), "task_id": int(task.task_id), "seed": int(seed),
                   "round": round_, **task_columns(task)}
            if extra_columns is not None:
                extra = dict(extra_columns(task))
                clash = sorted(set(extra) & set(row))
                if clash:
                    raise ValueError(f"extra_columns returned reserved column(s) {clash}; rename them.")
                row.update(extra)
            rows.append(row)
    finally:
        env.close()
    logger.info("env_dataset(%s): %d rows (seed %d)", env_id, len(rows), seed)
    return Dataset.from_list(rows)
