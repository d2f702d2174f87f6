"""Branching a native vector env: :meth:`BranchingMixin.branch` continues one sub-env's episode in others, in the
batch; :meth:`BranchingMixin.fork` continues it in scalar envs (docs/branching.md). Mixed into
:class:`~gym_llm.core.vector.LLMVectorEnv`, whose state (``episodes``, ``_done``, ``_last_obs``, streams, RNGs) it uses.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from gymnasium.error import ResetNeeded

from gym_llm.core.episode import Episode, ForkError, make_all

if TYPE_CHECKING:  # for annotations only: gym_llm.core.env imports this module
    from gym_llm.core.env import LLMEnv

__all__ = ["BranchingMixin", "SubEnvSnapshot"]


class SubEnvSnapshot:
    """A sub-env's episode at one step, forked and held outside the batch (:meth:`BranchingMixin.snapshot`)."""

    __slots__ = ("episode", "observation", "index")

    def __init__(self, episode: Episode, observation: Any, index: int):
        self.episode, self.observation, self.index = episode, observation, index

    def close(self) -> None:
        """Release what the fork holds (a lazily forked tool session, a sandbox)."""
        self.episode.close()


class BranchingMixin:
    """``branch`` and ``fork`` of :class:`~gym_llm.core.vector.LLMVectorEnv` (see the module docstring)."""

    PAUSABLE = True
    """Whether :meth:`pause` is supported (the hashing env's own batched step does not)."""

    def snapshot(self, index: int) -> "SubEnvSnapshot":
        """A fork of sub-env ``index``'s episode at its current step, held outside the batch: pass it to
        :meth:`branch` later to continue from this point (e.g. the state before a step that ended the episode).
        Close it with ``snapshot.close()`` when it is not used."""
        i = self._sub_env_index(index, "index")
        if not self._started or self._done[i]:
            raise ForkError(f"snapshot() needs an episode in progress in {self.where(i)}.")
        return SubEnvSnapshot(self._forked_episode(i), self._last_obs[i], i)

    def branch(self, source: "int | SubEnvSnapshot", targets: Sequence[int]):
        """Make sub-envs ``targets`` continue sub-env ``source``'s episode (or a :meth:`snapshot`'s): each gets a
        fork of it (see :meth:`gym_llm.core.episode.Episode.fork`: history, buffers, task and tool state copied;
        then they diverge) in place of its own episode, which is closed. The targets keep their group id and their
        own task stream (their next reset draws as before). E.g. ``k`` continuations of one prompt at turn ``t``:
        step, then ``branch(i, [j1, ..., jk])``, then step them all.

        Returns:
            The batch observation (the targets' rows now equal the source's).

        Raises:
            ValueError: a bad index, a target equal to the source or repeated, or a source whose episode has
                ended (reset it first). ForkError: the episode cannot be forked (the message names what).
                Nothing changes in any of these cases.
        """
        if not self._started:
            raise ResetNeeded("branch() needs a started env: call envs.reset() first.")
        if isinstance(source, SubEnvSnapshot):
            src, episode, observation = source.index, source.episode, source.observation
        else:
            src = self._sub_env_index(source, "source")
            if self._done[src]:
                raise ValueError(f"{self.where(src)} has ended (autoreset is off): there is no step to branch from; "
                                 "reset it first.")
            episode, observation = self.episodes[src], self._last_obs[src]
        if isinstance(targets, (int, np.integer)) or not hasattr(targets, "__iter__"):
            raise TypeError(f"targets must be a sequence of sub-env indices, got {type(targets).__name__}; "
                            f"e.g. envs.branch({src}, [{(src + 1) % self.num_envs}]).")
        dst = [self._sub_env_index(t, "target") for t in targets]
        if (src in dst and not isinstance(source, SubEnvSnapshot)) or len(set(dst)) != len(dst):
            raise ValueError(f"branch({src}, {dst}): targets must be distinct and differ from the source.")
        self._copy_episode(episode, dst)
        for t in dst:
            self._done[t] = False
            self._last_obs[t] = observation
        return self._batch(self._last_obs)

    def _copy_episode(self, source: Episode, dst: list[int]) -> None:
        """Put forks of ``source`` in sub-envs ``dst`` (all or none: a failed fork changes nothing)."""
        forks: list[Episode] = make_all(len(dst), source.fork)
        for t, episode in zip(dst, forks):
            old, self.episodes[t] = self.episodes[t], episode
            old.close()

    def pause(self, indices: Sequence[int]) -> None:
        """Hold sub-envs ``indices``: :meth:`step` leaves them as they are (their action is ignored; their row
        repeats the last observation with reward 0, not ended, and an empty info) until :meth:`unpause`. How a
        tree rollout keeps sub-envs waiting for a branch point without playing throwaway turns."""
        if not self.PAUSABLE:
            raise NotImplementedError(f"{type(self).__name__} cannot pause sub-envs.")
        for i in indices:
            self._paused[self._sub_env_index(i, "index")] = True

    def unpause(self, indices: Sequence[int]) -> None:
        """Step sub-envs ``indices`` again (see :meth:`pause`)."""
        for i in indices:
            self._paused[self._sub_env_index(i, "index")] = False

    @property
    def paused(self) -> np.ndarray:
        """``(N,)`` bool: the sub-envs :meth:`step` leaves as they are (a copy)."""
        return self._paused.copy()

    def fork(self, index: int, k: int = 1) -> list["LLMEnv"]:
        """``k`` scalar envs (:class:`~gym_llm.core.env.LLMEnv`) that continue sub-env ``index``'s episode from its
        current step, as :meth:`LLMEnv.fork <gym_llm.core.env.LLMEnv.fork>` does for a scalar env: they share this
        env's parts (task source, tools), which close with the last of this env and its forks. This env goes on
        unchanged."""
        i = self._sub_env_index(index, "index")
        if not self._started or self._done[i]:
            raise ForkError(f"fork() needs an episode in progress in {self.where(i)}: reset it first.")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"fork(index, k) takes the number of siblings, an int >= 1, got {k!r}.")
        users = self.__dict__.setdefault("_parts_users", [1])
        scalar, constructor = self._scalar_constructor()

        def sibling() -> "LLMEnv":
            env = object.__new__(scalar)
            if constructor is not None:  # pickles as its scalar env made again (needs reset, like any unpickled env)
                env.__dict__["_constructor"] = constructor
            env.parts, env.render_mode = self.parts, self.render_mode
            env.observation_space, env.action_space = self.single_observation_space, self.single_action_space
            env._episode = self._forked_episode(i)
            env._stream, env._round, env._needs_reset = copy.copy(self._streams[i]), self._rounds[i], False
            env._np_random = copy.deepcopy(self._rngs[i])
            env._parts_users, env._closed = users, False
            users[0] += 1
            return env

        return make_all(k, sibling)

    def _forked_episode(self, i: int) -> Episode:
        return self.episodes[i].fork()

    def _sub_env_index(self, index: Any, what: str) -> int:
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)) \
                or not 0 <= index < self.num_envs:
            raise ValueError(f"{what} must be a sub-env index in [0, {self.num_envs}), got {index!r}.")
        return int(index)
