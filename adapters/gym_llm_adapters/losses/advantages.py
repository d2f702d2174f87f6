"""Group-relative Monte-Carlo advantages (GRPO) and the group bookkeeping they need.

For episode ``i`` of group ``g`` (the ``G`` samples of one task in one round) with return ``R_i``::

    A_i = R_i - mean_{j in g} R_j                            # scale = "none"   (Dr. GRPO)
    A_i = (R_i - mean_{j in g} R_j) / (std_{j in g} R_j + eps)  # scale = "group"  (GRPO)
    A_i = (R_i - mean_{j in g} R_j) / (std_{all j} R_j + eps)   # scale = "batch"  (PPO-lite / REINFORCE++)

``std`` is the Bessel-corrected (``n - 1``) standard deviation, ``eps = 1e-4``: both as in TRL 1.16's
``GRPOTrainer``, so advantages match TRL's for the same rewards. A group of one episode gets advantage 0.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gym_llm_adapters.types import RolloutBatch

__all__ = ["AdvantageConfig", "group_advantages", "group_keys", "select_rows", "MCAdvantage"]

logger = logging.getLogger(__name__)

_SCALES = ("group", "batch", "none")


def group_keys(group_ids: np.ndarray, rounds: np.ndarray | None = None) -> np.ndarray:
    """``(B,)`` int64 dense group index per row: rows share an index iff they share ``(group_id, round)``."""
    group_ids = np.asarray(group_ids).reshape(-1)
    if rounds is None:
        return np.unique(group_ids, return_inverse=True)[1].astype(np.int64)
    pairs = np.stack([group_ids, np.asarray(rounds).reshape(-1)], axis=1)
    return np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


def group_advantages(
    rewards: np.ndarray,
    keys: np.ndarray,
    *,
    scale: Literal["group", "batch", "none"] = "group",
    eps: float = 1e-4,
) -> np.ndarray:
    """``(B,)`` float32 advantages of ``(B,)`` ``rewards`` grouped by ``(B,)`` integer ``keys`` (module docstring).

    >>> group_advantages(np.array([1.0, 0.0, 0.0, 0.0]), np.array([0, 0, 1, 1])).round(3)
    array([ 0.707, -0.707,  0.   ,  0.   ], dtype=float32)
    """
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {_SCALES}; got {scale!r}.")
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
    keys = np.asarray(keys).reshape(-1)
    if keys.shape != rewards.shape:
        raise ValueError(f"keys must have the rewards' shape {rewards.shape}; got {keys.shape}.")
    if not np.isfinite(rewards).all():
        raise ValueError("rewards must be finite; got NaN or inf (score every episode before computing advantages).")
    dense = np.unique(keys, return_inverse=True)[1].reshape(-1)
    counts = np.bincount(dense).astype(np.float64)  # (G,)
    means = np.bincount(dense, weights=rewards) / counts  # (G,)
    centred = rewards - means[dense]  # (B,)
    if scale == "none":
        advantages = centred
    elif scale == "group":
        sq = np.bincount(dense, weights=centred**2)
        std = np.sqrt(sq / np.maximum(counts - 1, 1))  # (G,) Bessel-corrected
        advantages = centred / (std[dense] + eps)
    else:
        std = rewards.std(ddof=1) if rewards.size > 1 else 0.0
        advantages = centred / (std + eps)
    advantages[counts[dense] < 2] = 0.0  # one sample: no baseline, no signal
    return advantages.astype(np.float32)


def select_rows(batch: RolloutBatch, rows: np.ndarray | Sequence[int]) -> RolloutBatch:
    """A new :class:`RolloutBatch` holding ``rows`` of ``batch`` (in that order); arrays are copied."""
    rows = np.asarray(rows, dtype=np.int64)
    changes = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        changes[f.name] = None if value is None else value[rows]
    return RolloutBatch(**changes)


@dataclass(frozen=True, kw_only=True)
class AdvantageConfig:
    """Settings of :class:`MCAdvantage` (TRL ``GRPOConfig`` names in brackets).

    Attributes:
        scale: ``"group"`` divides by the group's reward std (GRPO), ``"batch"`` by the batch's,
            ``"none"`` only centres (Dr. GRPO: avoids the question-difficulty bias) [``scale_rewards``].
        eps: added to the std before dividing; keeps groups with equal rewards finite (their centred rewards
            are 0, so their advantage is 0). Must be > 0.
        group_size: when set, every group in a batch must have exactly this many episodes (catches a
            collector that split a group); None accepts any size >= 1 [``num_generations``].
        drop_constant_groups: drop the episodes of groups whose rewards are all equal (zero advantage, no
            gradient signal) — DAPO's dynamic sampling filter. The returned batch is then smaller.
    """

    scale: Literal["group", "batch", "none"] = "group"
    eps: float = 1e-4
    group_size: int | None = None
    drop_constant_groups: bool = False

    def __post_init__(self) -> None:
        if self.scale not in _SCALES:
            raise ValueError(f"scale must be one of {_SCALES}; got {self.scale!r}.")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0; got {self.eps}.")
        if self.group_size is not None and self.group_size < 1:
            raise ValueError(f"group_size must be >= 1 or None; got {self.group_size}.")


class MCAdvantage:
    """Fills ``RolloutBatch.advantages`` with group-relative Monte-Carlo advantages of the episode returns.

    Groups are the rows sharing ``(group_id, round)`` (the vector env gives every member of group ``g`` in
    round ``r`` the same task). Use :class:`GroupBuffer` first when batches can split groups.

    >>> import numpy as np
    >>> from gym_llm_adapters.types import RolloutBatch
    >>> z = np.zeros((4, 3))
    >>> batch = RolloutBatch(input_ids=z.astype(np.int64), attention_mask=z.astype(np.int8),
    ...     policy_mask=z.astype(np.int8), logprobs=z.astype(np.float32),
    ...     rewards=np.array([1, 0, 2, 2], np.float32), group_ids=np.array([0, 0, 1, 1]),
    ...     task_ids=np.array([5, 5, 6, 6]), rounds=np.zeros(4, np.int64), versions=np.zeros(4, np.int64))
    >>> MCAdvantage(AdvantageConfig(scale="none"))(batch).advantages
    array([ 0.5, -0.5,  0. ,  0. ], dtype=float32)
    """

    def __init__(self, config: AdvantageConfig | None = None) -> None:
        self.config = config if config is not None else AdvantageConfig()
        self.last_dropped_failed = 0

    def __repr__(self) -> str:
        return f"MCAdvantage({self.config})"

    def __call__(self, batch: RolloutBatch) -> RolloutBatch:
        """A copy of ``batch`` with ``advantages`` set (and constant groups dropped if configured).

        Rows whose reward could not be computed (``batch.reward_failed``: a judge or grader failure) are dropped
        first: a group's mean and std are over its scored members, and the returned batch is smaller (empty when
        nothing was scored). Their count is :attr:`last_dropped_failed`."""
        if not isinstance(batch, RolloutBatch):
            raise TypeError(f"MCAdvantage expects a RolloutBatch; got {type(batch).__name__}. "
                            "For raw arrays use group_advantages(rewards, keys).")
        keys = group_keys(batch.group_ids, batch.rounds)
        counts = np.bincount(keys)
        size = self.config.group_size
        if size is not None and (counts != size).any():
            bad = sorted({int(c) for c in counts if c != size})
            raise ValueError(
                f"every group must hold group_size={size} episodes; found groups of {bad}. "
                "Gather complete groups with GroupBuffer(group_size) before computing advantages."
            )
        failed = batch.reward_failed
        self.last_dropped_failed = int(failed.sum()) if failed is not None else 0
        if self.last_dropped_failed:
            logger.info("left %d of %d episodes out of the loss: their reward could not be computed",
                        self.last_dropped_failed, len(batch))
            batch = select_rows(batch, np.flatnonzero(~failed))
            if len(batch) == 0:
                return dataclasses.replace(batch, advantages=np.zeros(0, dtype=np.float32))
            keys = group_keys(batch.group_ids, batch.rounds)
            counts = np.bincount(keys)
        advantages = group_advantages(batch.rewards, keys, scale=self.config.scale, eps=self.config.eps)
        out = dataclasses.replace(batch, advantages=advantages)
        if self.config.drop_constant_groups:
            high = np.full(len(counts), -np.inf)
            low = np.full(len(counts), np.inf)
            np.maximum.at(high, keys, batch.rewards)
            np.minimum.at(low, keys, batch.rewards)
            keep = np.flatnonzero((high > low)[keys])
            if len(keep) < len(batch):
                logger.debug("dropped %d of %d episodes in constant-reward groups", len(batch) - len(keep), len(batch))
            out = select_rows(out, keep)
        return out
