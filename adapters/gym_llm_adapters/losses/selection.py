"""Top-k reward selection of episodes per group (best-of-n / rejection sampling for SFT, expert iteration)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from gym_llm_adapters.losses.advantages import group_keys, select_rows
from gym_llm_adapters.rollout_io import read_rollouts
from gym_llm_adapters.types import RolloutBatch, Trajectory

__all__ = ["TopKRewardSelector", "select_rollouts"]


class TopKRewardSelector:
    """Keeps the ``k`` highest-reward episodes of every group ``(group_id, round)``.

    Ties go to the earlier episode; kept episodes stay in their original order. Groups smaller than ``k``
    are kept whole (or rejected, see ``group_size``). Pair with :class:`~gym_llm_adapters.losses.GroupBuffer`
    when a batch can split groups, and with :class:`~gym_llm_adapters.losses.SFTLoss` to fine-tune on the
    winners.

    Args:
        k: episodes to keep per group. Must be >= 1.
        group_size: when set, every group must hold exactly this many episodes (and ``k <= group_size``).
        min_reward: when set, episodes with a reward below it are dropped even if in the top k (e.g. keep
            only correct answers).

    >>> TopKRewardSelector(1).indices(np.array([0.0, 1.0, 1.0, 0.5]), np.array([0, 0, 1, 1]))
    array([1, 2])
    """

    def __init__(self, k: int, *, group_size: int | None = None, min_reward: float | None = None) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1; got {k}.")
        if group_size is not None and not k <= group_size:
            raise ValueError(f"k ({k}) must be <= group_size ({group_size}).")
        self.k = k
        self.group_size = group_size
        self.min_reward = min_reward

    def __repr__(self) -> str:
        return f"TopKRewardSelector(k={self.k}, group_size={self.group_size}, min_reward={self.min_reward})"

    def indices(self, rewards: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Sorted row indices kept from ``(B,)`` ``rewards`` grouped by ``(B,)`` integer ``keys``."""
        rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
        keys = np.asarray(keys).reshape(-1)
        if keys.shape != rewards.shape:
            raise ValueError(f"keys must have the rewards' shape {rewards.shape}; got {keys.shape}.")
        if np.isnan(rewards).any():
            raise ValueError("rewards contain NaN; score every episode before selecting.")
        if self.group_size is not None:
            counts = np.unique(keys, return_counts=True)[1]
            if (counts != self.group_size).any():
                raise ValueError(f"every group must hold group_size={self.group_size} episodes; "
                                 f"found sizes {sorted(set(counts.tolist()))}.")
        # Sort by group, then reward descending, then row (stable): the first k of each group win.
        order = np.lexsort((np.arange(len(rewards)), -rewards, keys))
        sorted_keys = keys[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_keys)) + 1]  # first position of each group
        rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        kept = order[rank < self.k]
        if self.min_reward is not None:
            kept = kept[rewards[kept] >= self.min_reward]
        return np.sort(kept)

    def __call__(self, batch: RolloutBatch) -> RolloutBatch:
        """The rows of ``batch`` that are among the top ``k`` of their group."""
        if not isinstance(batch, RolloutBatch):
            raise TypeError(f"expected a RolloutBatch; got {type(batch).__name__}. Use .select() for trajectories.")
        return select_rows(batch, self.indices(batch.rewards, group_keys(batch.group_ids, batch.rounds)))

    def select(self, trajectories: Sequence[Trajectory]) -> list[Trajectory]:
        """The top ``k`` trajectories of each group, in their original order."""
        if not trajectories:
            return []
        rewards = np.array([t.reward for t in trajectories])
        keys = group_keys(np.array([t.group_id for t in trajectories]), np.array([t.round for t in trajectories]))
        return [trajectories[i] for i in self.indices(rewards, keys)]


def _load(rollouts: Sequence[Trajectory] | str | os.PathLike) -> list[Trajectory]:
    if isinstance(rollouts, (str, os.PathLike)):
        records = read_rollouts(rollouts)
    else:
        records = list(rollouts)
    bad = next((r for r in records if not isinstance(r, Trajectory)), None)
    if bad is not None:
        raise TypeError(
            f"Selecting rollouts for SFT needs trajectories (whole episodes), got a {type(bad).__name__}; collect in "
            "episodes mode (Collector(episodes_per_batch=...), Collector.run_episodes, EnvRolloutFunc or gym-llm eval)."
        )
    return records


def select_rollouts(rollouts: Sequence[Trajectory] | str | os.PathLike, *, top_k: int | None = None,
                    min_reward: float | None = None) -> list[Trajectory]:
    """The episodes to fine-tune on, in their original order.

    Args:
        rollouts: trajectories, or a rollout file/folder written by a
            :class:`~gym_llm_adapters.rollout_io.RolloutWriter`.
        top_k: keep the ``k`` highest-return episodes of each group ``(group_id, round)`` (ties: the earlier one).
        min_reward: keep only episodes whose return is at least this (with ``top_k``: among the top ``k``).
            Neither: keep everything.
    """
    trajectories = _load(rollouts)
    if top_k is None and min_reward is None or not trajectories:
        return trajectories
    k = top_k if top_k is not None else len(trajectories)
    return TopKRewardSelector(k, min_reward=min_reward).select(trajectories)
