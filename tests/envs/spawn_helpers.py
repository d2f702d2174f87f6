"""Importable env factories for processes started with ``spawn``/``forkserver`` (they import this module by name)."""

from __future__ import annotations

from typing import Any


def make_env(env_id: str, kwargs: dict[str, Any]) -> Any:
    import gymnasium as gym

    import gym_llm  # noqa: F401  (a spawned process registers the ids itself)

    return gym.make(env_id, **kwargs)
