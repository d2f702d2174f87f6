"""The scalar Gymnasium env that drives one :class:`~gym_llm.core.episode.Episode`."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.error import ResetNeeded

from gym_llm.core.episode import EnvCore, resolve_reset_task
from gym_llm.core.pickling import ConstructorPickle
from gym_llm.core.tasks import TaskStream

__all__ = ["LLMEnv", "TASK_SEED_BOUND"]

TASK_SEED_BOUND = 2**62
"""Task-stream seeds are drawn from ``np_random.integers(TASK_SEED_BOUND)`` right after seeding."""


class LLMEnv(ConstructorPickle, gym.Env):
    """A Gymnasium env over one LLM episode at a time (see the concrete envs for their docs).

    Seeding: ``reset(seed=s)`` seeds ``self.np_random`` and draws the task-stream seed from it, so the
    task sequence depends on ``s`` only. ``reset()`` without a seed moves on to the next round (the next
    task in the stream). ``reset(options={"task_id": i})`` runs task ``i`` of the source instead.

    ``info`` always holds ``task_id`` (index into the task source) and ``round`` (episode number
    since the last seeded reset).

    Pickling: an env pickles as its class and constructor arguments and unpickles by being made again
    (:mod:`gym_llm.core.pickling`); the copy needs ``reset()``.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, core: EnvCore, *, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}."
            )
        self.core = core
        self.render_mode = render_mode
        self.observation_space = core.observation_space
        self.action_space = core.action_space
        self._episode = core.new_episode()
        self._stream: TaskStream | None = None
        self._round = -1
        self._needs_reset = True

    @property
    def episode(self):
        """The current :class:`~gym_llm.core.episode.Episode` (messages, tokens, task)."""
        return self._episode

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        forced = resolve_reset_task(self.core.tasks, options)
        super().reset(seed=seed)
        if seed is not None or self._stream is None:
            task_seed = int(self.np_random.integers(TASK_SEED_BOUND))
            self._stream = TaskStream(len(self.core.tasks), task_seed, self.core.task_order)
            self._round = 0
        else:
            self._round += 1
        task = forced if forced is not None else self.core.tasks[self._stream.task_index(self._round)]
        observation, info = self._episode.start(task)
        info["task_id"] = task.task_id
        info["round"] = self._round
        self._needs_reset = False
        return observation, info

    def step(self, action: Any):
        if self._needs_reset:
            raise ResetNeeded(
                "step() was called before reset() or after the episode ended; call env.reset() first."
            )
        checked = self._episode.check_action(action)
        response = self._episode.respond(checked)
        transition = self._episode.advance(checked, response)
        info = transition.info
        info["task_id"] = self._episode.task.task_id
        info["round"] = self._round
        if transition.terminated or transition.truncated:
            self._needs_reset = True
        return transition.observation, transition.reward, transition.terminated, transition.truncated, info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._episode.render()
        return None

    def close(self) -> None:
        self._episode.close()
        self.core.close()
        super().close()
