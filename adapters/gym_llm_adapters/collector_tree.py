"""Tree rollouts for the collector (``Collector(branch_turn=t)``): each GRPO group shares its first turns.

A group's first member (the *leader*) plays alone while the others are paused (the vector env leaves them as they
are: :meth:`~gym_llm.core.branching.BranchingMixin.pause`; nothing is generated for them). When the leader has taken
``t`` steps, the others continue forks of its episode (:meth:`~gym_llm.core.branching.BranchingMixin.branch`:
conversation, buffers, a Python REPL's variables and files) and every member goes on on its own. If the leader's
episode ends at a step ``k <= t``, the others continue from the state before that step (a snapshot taken before each
of the leader's solo steps), so the group shares ``k - 1`` turns. The ``G`` trajectories of a group then share their
first ``shared_turns`` steps exactly (the same records) and differ after: GRPO compares continuations of one state.

The shared steps' tokens are context in every member (``policy_mask`` 0): with advantages normalised within the
group, the prefix's advantage is the group's mean, 0, so no member trains on it (``Trajectory.shared_turns``).

Rounds are group-synchronous: a member whose episode has ended is paused until the whole group has ended; then the
leader starts the group's next round alone. Generation saved against flat GRPO: ``(G - 1) * shared_turns`` turns per
group.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["TreeState", "check_tree_envs"]


def check_tree_envs(envs: list[Any], branch_turn: Any, *, mode: str, overlap: bool) -> None:
    """Refuse settings tree rollouts cannot run with, naming the fix."""
    if isinstance(branch_turn, bool) or not isinstance(branch_turn, int) or branch_turn < 1:
        raise ValueError(f"branch_turn must be an int >= 1 (the group's members share the leader's first "
                         f"branch_turn turns), got {branch_turn!r}.")
    if mode != "episodes":
        raise ValueError("branch_turn= needs episodes mode (episodes_per_batch=): a tree group is released whole.")
    if overlap:
        raise ValueError("branch_turn= does not run with overlap=True yet; drop one of them.")
    for env in envs:
        base = env.unwrapped
        if not getattr(base, "PAUSABLE", False) or not hasattr(base, "branch"):
            raise ValueError(f"branch_turn= needs gym_llm's native vector envs, which can pause and branch sub-envs; "
                             f"{type(base).__name__} cannot (make it with gym.make_vec(id, vectorization_mode="
                             "'vector_entry_point'); the hashing env's batched step cannot pause: use get_state/"
                             "set_state there).")
        if int(getattr(base, "group_size", 1)) < 2:
            raise ValueError("branch_turn= needs groups of 2 or more sub-envs (make the env with group_size=G >= 2).")


@dataclass(eq=False)
class TreeState:
    """One shard's tree bookkeeping (module docstring). Group ``g``'s leader is sub-env ``g * G``."""

    branch_turn: int
    group_size: int
    num_envs: int
    solo: np.ndarray = field(init=False)  # (groups,) bool: the leader plays alone (its followers wait)
    ended: np.ndarray = field(init=False)  # (groups,) int: members whose episode of this round has ended
    paused: np.ndarray = field(init=False)  # (N,) bool: mirrors the env's paused sub-envs
    snapshots: dict[int, tuple[Any, Any, np.ndarray, str]] = field(default_factory=dict)  # group -> before-step state

    def __post_init__(self) -> None:
        groups = self.num_envs // self.group_size
        self.solo = np.ones(groups, dtype=bool)
        self.ended = np.zeros(groups, dtype=np.int64)
        self.paused = np.zeros(self.num_envs, dtype=bool)

    # ------------------------------------------------------------------------------ hooks
    def start(self, shard: Any) -> None:
        """After the shard's reset: every group starts a round with its leader alone."""
        self.close()
        self.solo[:] = True
        self.ended[:] = 0
        env = shard.env.unwrapped
        env.unpause(range(self.num_envs))
        self.paused[:] = False
        followers = [i for i in range(self.num_envs) if i % self.group_size]
        env.pause(followers)
        self.paused[followers] = True

    def before_step(self, shard: Any, active: np.ndarray) -> None:
        """Snapshot each solo leader about to step (its state if this step ends its episode)."""
        env = shard.env.unwrapped
        for g in np.flatnonzero(self.solo):
            leader = int(g) * self.group_size
            if not active[leader] or shard.builders[leader] is None:
                continue
            old = self.snapshots.pop(int(g), None)
            if old is not None:
                old[0].close()
            self.snapshots[int(g)] = (env.snapshot(leader), copy.deepcopy(shard.builders[leader]),
                                      shard.prompts[leader].copy(), shard.texts[leader])

    def stepped(self, shard: Any, i: int, done: bool) -> None:
        """Sub-env ``i`` took a step (recorded; before its trajectory is finished when ``done``): branch a solo
        leader's group at the branch point."""
        g, member = divmod(i, self.group_size)
        if member or not self.solo[g]:
            return
        builder = shard.builders[i]
        followers = list(range(i + 1, i + self.group_size))
        env = shard.env.unwrapped
        if done:  # ended at step k <= t: the others continue from the state before that step
            snapshot, template, prompt, text = self.snapshots.pop(g)
            try:
                env.branch(snapshot, followers)
            finally:
                snapshot.close()
            builder.shared_turns = len(template.steps)
        elif len(builder.steps) >= self.branch_turn:
            env.branch(i, followers)
            template, prompt, text = builder, shard.prompts[i], shard.texts[i]
            builder.shared_turns = len(builder.steps)
            old = self.snapshots.pop(g, None)
            if old is not None:
                old[0].close()
        else:
            return
        for f in followers:
            member_builder = copy.deepcopy(template)
            member_builder.env_index = shard.offset + f
            member_builder.shared_turns = builder.shared_turns
            shard.builders[f], shard.prompts[f], shard.texts[f] = member_builder, prompt.copy(), text
            shard.pending_reset[f] = False
        env.unpause(followers)
        self.paused[followers] = False
        self.solo[g] = False

    def ended_episode(self, shard: Any, i: int) -> None:
        """Sub-env ``i``'s episode of this round has ended (its trajectory is out): it waits for its group; the
        group's last one starts the next round with the leader alone."""
        g = i // self.group_size
        env = shard.env.unwrapped
        env.pause([i])
        self.paused[i] = True
        self.ended[g] += 1
        if self.ended[g] == self.group_size:
            leader = g * self.group_size
            self.ended[g] = 0
            self.solo[g] = True
            env.unpause([leader])
            self.paused[leader] = False

    def close(self) -> None:
        for snapshot, *_ in self.snapshots.values():
            snapshot.close()
        self.snapshots.clear()
