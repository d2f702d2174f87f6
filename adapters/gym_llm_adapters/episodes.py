"""Building token-exact trajectories from steps, and releasing them by GRPO group.

:class:`EpisodeBuilder` follows one sub-env's episode. Its sequence starts as the first observation's
tokens; every step appends the sampled ids (``policy_mask = 1``, with their engine log-probs) and the
tokens the env adds before the next observation (``policy_mask = 0``): the next observation must start
with the sequence so far, which holds exactly in tokens mode (the env appends, never re-tokenises). In
text mode the observation is re-tokenised text; when that breaks the prefix (a template that rewrites
history, or a non-canonical sampled tokenisation) the builder restarts the sequence from the new
observation, marks earlier turns as context (``policy_mask = 0``) and sets ``token_exact = False`` on the
trajectory — the per-step records stay exact either way.

:class:`GroupBuffer` holds finished trajectories until all ``G`` members of a group's round are done.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from gym_llm_adapters.types import Completion, StepRecord, Trajectory

__all__ = ["EpisodeBuilder", "GroupBuffer", "info_at", "scalar_info"]

logger = logging.getLogger(__name__)
_warned_drift = False  # the text-mode drift warning is logged once per process


def info_at(infos: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Sub-env ``index``'s info from Gymnasium's batched dict of arrays (``_key`` masks respected)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get("_" + key)
        if mask is not None and not mask[index]:
            continue
        out[key] = info_at(value, index) if isinstance(value, Mapping) else value[index]
    return out


def scalar_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-able scalars and strings of an info dict (per-token arrays and final_* dropped)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key in ("final_obs", "final_info", "policy_mask"):
            continue
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, (bool, int, float, str)):
            out[key] = value
    return out


class EpisodeBuilder:
    """One sub-env's running episode (see the module docstring).

    Args:
        env_index / task_id / group_id / round: where the episode runs and what it is about.
        prompt_ids: the first observation's tokens.
        env_id / spec_id: the env that runs it and its recorded spec (stamped on every record).
    """

    __slots__ = ("env_index", "task_id", "group_id", "round", "prompt_length", "steps", "token_exact", "env_id",
                 "spec_id", "shared_turns", "_ids", "_mask", "_logprobs", "_turn", "_n")

    def __init__(self, env_index: int, task_id: int, group_id: int, round_: int, prompt_ids: np.ndarray,
                 env_id: str = "", spec_id: str = ""):
        self.env_index, self.task_id, self.group_id, self.round = env_index, task_id, group_id, round_
        self.env_id, self.spec_id = env_id, spec_id
        self.prompt_length = len(prompt_ids)
        self.steps: list[StepRecord] = []
        self.token_exact = True
        self.shared_turns = 0  # leading steps shared with the other members of a tree group (Collector branch_turn)
        capacity = max(64, 2 * len(prompt_ids))
        self._ids = np.zeros(capacity, dtype=np.int64)
        self._mask = np.zeros(capacity, dtype=np.int8)
        self._logprobs = np.zeros(capacity, dtype=np.float32)
        self._turn = np.full(capacity, -1, dtype=np.int32)  # which step sampled each token (-1: not the policy)
        self._n = 0
        self._append(prompt_ids, 0, None)

    @property
    def token_ids(self) -> np.ndarray:
        return self._ids[: self._n]

    def _append(self, ids: np.ndarray, mask: int, logprobs: np.ndarray | None) -> None:
        end = self._n + len(ids)
        if end > len(self._ids):
            size = max(end, 2 * len(self._ids))
            for name in ("_ids", "_mask", "_logprobs", "_turn"):
                old = getattr(self, name)
                new = np.zeros(size, dtype=old.dtype)
                new[: self._n] = old[: self._n]
                setattr(self, name, new)
        self._ids[self._n: end] = ids
        self._mask[self._n: end] = mask
        self._logprobs[self._n: end] = 0.0 if logprobs is None else logprobs
        self._turn[self._n: end] = len(self.steps) if mask else -1
        self._n = end

    def observe(self, prompt_ids: np.ndarray) -> None:
        """Align the sequence with the observation the policy is about to condition on."""
        n = self._n
        if len(prompt_ids) >= n and np.array_equal(prompt_ids[:n], self._ids[:n]):
            self._append(prompt_ids[n:], 0, None)
            return
        global _warned_drift
        if self.token_exact and not _warned_drift:
            _warned_drift = True
            logger.warning(
                "Sub-env %d: the observation does not extend the token sequence (text mode re-tokenises the "
                "conversation); the trajectory restarts from this observation with earlier turns as context. "
                "Use the env's tokens mode for token-exact multi-turn trajectories.", self.env_index)
        self.token_exact = False
        self._n = 0
        self._append(prompt_ids, 0, None)

    def add_step(self, completion: Completion, *, reward: float, terminated: bool, truncated: bool,
                 info: Mapping[str, Any], prompt_text: str = "") -> StepRecord:
        """Record one step: the sampled ids join the sequence and a :class:`StepRecord` is kept."""
        self._append(completion.token_ids, 1, completion.logprobs)
        record = StepRecord(
            env_index=self.env_index, task_id=self.task_id, group_id=self.group_id, round=self.round,
            turn=len(self.steps) + 1, prompt_ids=completion.prompt_ids, completion_ids=completion.token_ids,
            logprobs=completion.logprobs, reward=float(reward), terminated=bool(terminated),
            truncated=bool(truncated), version=completion.version, prompt_text=prompt_text,
            completion_text=completion.text, finish_reason=completion.finish_reason, info=scalar_info(info),
            env_id=self.env_id, spec_id=self.spec_id,
        )
        self.steps.append(record)
        return record

    def finish(self, final_ids: np.ndarray | None, env_policy_mask: np.ndarray | None) -> Trajectory:
        """The finished trajectory.

        ``final_ids`` (tokens mode: the env's final observation) may cut the last action (the env kept
        only what fit in ``max_seq_len``) or extend it; ``env_policy_mask`` must then agree with ours.
        """
        if final_ids is not None and self.token_exact:
            n = self._n
            if len(final_ids) <= n and np.array_equal(final_ids, self._ids[: len(final_ids)]):
                self._n = len(final_ids)
            elif len(final_ids) > n and np.array_equal(final_ids[:n], self._ids[:n]):
                self._append(final_ids[n:], 0, None)
            else:
                raise RuntimeError(
                    f"Sub-env {self.env_index}: the env's final observation is not the sampled sequence; the env "
                    "changed tokens the policy sampled."
                )
        mask = self._mask[: self._n].copy()
        if env_policy_mask is not None and self.token_exact:
            theirs = np.asarray(env_policy_mask)[: self._n]
            if len(theirs) != self._n or not np.array_equal(theirs.astype(np.int8), mask):
                raise RuntimeError(f"Sub-env {self.env_index}: the env's policy_mask disagrees with the sampled positions.")
        if self.shared_turns:  # a tree group's shared turns: context for every member, trained in none (docs/branching.md)
            mask[self.shared_positions()] = 0
        turns = self._turn[: self._n][mask.astype(bool)]
        turn_tokens = np.bincount(turns, minlength=len(self.steps)).tolist() if len(turns) else [0] * len(self.steps)
        return Trajectory(
            task_id=self.task_id, group_id=self.group_id, round=self.round,
            token_ids=self._ids[: self._n].copy(), policy_mask=mask, logprobs=self._logprobs[: self._n].copy(),
            prompt_length=self.prompt_length if self.token_exact else 0,
            rewards=[s.reward for s in self.steps], versions=[s.version for s in self.steps],
            terminated=self.steps[-1].terminated, truncated=self.steps[-1].truncated, steps=self.steps,
            token_exact=self.token_exact, env_index=self.env_index, env_id=self.env_id, turn_tokens=turn_tokens,
            spec_id=self.spec_id, shared_turns=self.shared_turns,
        )

    def shared_positions(self) -> np.ndarray:
        """``(n,)`` bool: the tokens the policy sampled in the first :attr:`shared_turns` steps."""
        turn = self._turn[: self._n]
        return (turn >= 0) & (turn < self.shared_turns)


class GroupBuffer:
    """Finished trajectories, released a whole GRPO group (all ``group_size`` members of a round) at a time.

    Multi-turn and async collection finish episodes out of order and can split a group across
    batches; GRPO needs whole groups. :meth:`add` returns the groups the new trajectories complete
    (members ordered by sub-env index) and also queues them, so a consumer may either use the return
    value or drain the queue with :meth:`pop` (the collector does the latter).

    Args:
        group_size: episodes per group (the env's ``group_size``), >= 1.
        max_pending_groups: raise ``RuntimeError`` when more incomplete groups than this are waiting (a
            sign that group members are being lost upstream); None = unbounded.
        queue: keep completed groups for :meth:`pop` (set False when only the return value is used).
    """

    def __init__(self, group_size: int, *, max_pending_groups: int | None = None, queue: bool = True):
        if int(group_size) < 1:
            raise ValueError(f"group_size must be >= 1; got {group_size}.")
        self.group_size = int(group_size)
        self.max_pending_groups = max_pending_groups
        self._queue = queue
        self._open: dict[tuple[int, int], list[Trajectory]] = {}
        self._ready: deque[list[Trajectory]] = deque()
        self.num_ready = 0

    def __len__(self) -> int:
        """Trajectories waiting for the rest of their group."""
        return self.num_open

    def add(self, trajectories: Trajectory | Iterable[Trajectory]) -> list[list[Trajectory]]:
        """Buffer one trajectory or many; return the groups they complete, oldest first."""
        batch = [trajectories] if isinstance(trajectories, Trajectory) else list(trajectories)
        done: list[list[Trajectory]] = []
        for trajectory in batch:
            key = (int(trajectory.group_id), int(trajectory.round))
            members = self._open.setdefault(key, [])
            members.append(trajectory)
            if len(members) == self.group_size:
                del self._open[key]
                members.sort(key=lambda t: t.env_index)
                done.append(members)
        if self.max_pending_groups is not None and len(self._open) > self.max_pending_groups:
            raise RuntimeError(
                f"{len(self._open)} incomplete groups are pending (max_pending_groups={self.max_pending_groups}); "
                "episodes of those groups were probably dropped upstream."
            )
        if self._queue:
            self._ready.extend(done)
            self.num_ready += sum(len(g) for g in done)
        return done

    def pop(self, num_episodes: int) -> list[Trajectory]:
        """``num_episodes`` trajectories (whole groups, oldest first); needs ``num_ready >= num_episodes``."""
        out: list[Trajectory] = []
        while len(out) < num_episodes:
            group = self._ready.popleft()
            out.extend(group)
            self.num_ready -= len(group)
        return out

    def drop_open(self, which: Callable[[tuple[int, int]], bool]) -> int:
        """Forget the incomplete groups whose ``(group_id, round)`` key ``which`` accepts (their other members will
        never come: the sub-envs that ran them were restarted); returns how many finished episodes were dropped."""
        keys = [key for key in self._open if which(key)]
        return sum(len(self._open.pop(key)) for key in keys)

    @property
    def num_open(self) -> int:
        """Trajectories waiting for the rest of their group."""
        return sum(len(m) for m in self._open.values())
