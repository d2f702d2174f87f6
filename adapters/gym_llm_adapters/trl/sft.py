"""Collected rollouts as SFT datasets for TRL's ``SFTTrainer`` (rejection sampling / expert iteration).

:func:`sft_dataset` selects episodes — the top ``k`` of each GRPO group and/or those with a return of at least
``min_reward`` (:class:`~gym_llm_adapters.losses.selection.TopKRewardSelector`) — and writes them in one of
TRL's formats:

| ``format`` | columns | SFTTrainer | exact? |
|---|---|---|---|
| ``"tokens"`` (default) | ``input_ids`` (the episode's ``S`` tokens), ``assistant_masks`` (``S``: 1 on the tokens the policy sampled) | pre-tokenized dataset: labels are ``-100`` where ``assistant_masks == 0``. Leave ``assistant_only_loss=False`` (TRL allows that flag only for conversational data; the mask applies anyway) | token-exact: the ids the policy sampled and the env's own tokens, never re-tokenised |
| ``"messages"`` | ``messages`` (the conversation: system, user, assistant, tool, ...) | conversational dataset; ``assistant_only_loss=True`` trains on assistant turns (the chat template needs ``{% generation %}`` markers; TRL patches the common ones) | re-rendered by the chat template (text-exact, not token-exact) |

Both carry ``task_id``, ``group_id``, ``round`` and ``reward`` columns. ``"messages"`` needs the conversation,
which envs record with ``record_messages=True`` (:class:`~gym_llm_adapters.trl.rollout.EnvRolloutFunc` always
does).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Literal, Sequence

from gym_llm_adapters.losses.selection import select_rollouts
from gym_llm_adapters.types import Trajectory

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["select_rollouts", "sft_dataset", "sft_rows"]  # select_rollouts: the losses' one, re-exported

SFTFormat = Literal["tokens", "messages"]


def _messages(trajectory: Trajectory, index: int) -> list[dict[str, Any]]:
    encoded = trajectory.steps[-1].info.get("messages") if trajectory.steps else None
    if not isinstance(encoded, str):
        raise ValueError(
            f"Trajectory {index} (task {trajectory.task_id}) carries no conversation; format='messages' needs envs made "
            "with record_messages=True (EnvRolloutFunc sets it), or use format='tokens'."
        )
    return [{"role": m["role"], "content": m["content"], **{k: m[k] for k in ("name", "tool_call_id") if k in m}}
            for m in json.loads(encoded)]


def sft_rows(trajectories: Sequence[Trajectory], format: SFTFormat = "tokens") -> list[dict[str, Any]]:
    """One row per trajectory in ``format`` (see the module docstring), as plain dicts."""
    if format not in ("tokens", "messages"):
        raise ValueError(f"format must be 'tokens' (input_ids + assistant_masks) or 'messages', got {format!r}.")
    rows = []
    for index, t in enumerate(trajectories):
        meta = {"task_id": int(t.task_id), "group_id": int(t.group_id), "round": int(t.round), "reward": float(t.reward)}
        if format == "tokens":
            rows.append({"input_ids": t.token_ids.tolist(), "assistant_masks": t.policy_mask.astype(int).tolist(), **meta})
        else:
            rows.append({"messages": _messages(t, index), **meta})
    return rows


def sft_dataset(rollouts: Sequence[Trajectory] | str | os.PathLike, *, format: SFTFormat = "tokens",
                top_k: int | None = None, min_reward: float | None = None) -> "Dataset":
    """Selected rollouts as a ``datasets.Dataset`` for ``SFTTrainer`` (see the module docstring).

    Raises:
        ValueError: nothing is left after selection, an unknown ``format``, or ``format="messages"`` without
            recorded conversations.
    """
    from datasets import Dataset

    selected = select_rollouts(rollouts, top_k=top_k, min_reward=min_reward)
    if not selected:
        raise ValueError(
            f"No episode is left to fine-tune on (top_k={top_k}, min_reward={min_reward}); collect more episodes "
            "or relax the selection."
        )
    return Dataset.from_list(sft_rows(selected, format))
