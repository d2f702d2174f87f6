"""How the collector reads gym_llm vector envs: their mode, action length, and one sub-env's observation.

Also the check that envs and sampling settings can be collected from at all. The Ray env workers use
the same mode detection.
Kept apart from :mod:`gym_llm_adapters.collector`, which is the stepping logic.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from gymnasium import spaces
from gymnasium.vector import VectorEnv

from gym_llm.core.spaces import unpack_tokens
from gym_llm_adapters.engines.base import SamplingConfig

__all__ = ["check_settings", "env_mode", "action_length", "vocab_size", "obs_at", "token_ids"]

def check_settings(envs: list[Any], sampling: Any, episodes_per_batch: int | None, steps_per_batch: int | None) -> None:
    if not envs or not all(isinstance(e, VectorEnv) for e in envs):
        raise TypeError("envs must be a gymnasium VectorEnv or a non-empty list of them (gym.make_vec(...)).")
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}.")
    if sampling.n != 1:
        raise ValueError(
            f"The collector samples one completion per sub-env (sampling.n=1), got n={sampling.n}; for GRPO "
            "groups make the env with group_size=G (gym.make_vec(id, num_envs=N, group_size=G))."
        )
    if (episodes_per_batch is None) == (steps_per_batch is None):
        raise ValueError("Give exactly one of episodes_per_batch= (episodes mode) or steps_per_batch= (steps mode).")


def env_mode(env: VectorEnv) -> Literal["text", "tokens"]:
    space = env.single_observation_space
    if isinstance(space, spaces.Text):
        return "text"
    if isinstance(space, spaces.Dict) and "input_ids" in space.spaces and "attention_mask" in space.spaces:
        return "tokens"
    raise TypeError(
        f"The collector drives text envs (Text observations) and token envs (Dict of input_ids/attention_mask); "
        f"this env's single_observation_space is {space}."
    )


def action_length(env: VectorEnv, mode: str) -> int:
    space = env.single_action_space
    if mode == "tokens":
        return int(space["input_ids"].shape[0])
    return int(getattr(space, "max_length", 2**31 - 1))


def vocab_size(env: VectorEnv, mode: str) -> int | None:
    """The ids a tokens-mode env accepts are ``[0, vocab_size)``; ``None`` in text mode (no bound from the env)."""
    if mode != "tokens":
        return None
    nvec = getattr(env.single_action_space["input_ids"], "nvec", None)
    return None if nvec is None else int(np.max(nvec))


def obs_at(observations: Any, i: int) -> Any:
    if isinstance(observations, dict):
        return {k: v[i] for k, v in observations.items()}
    return observations[i]


def token_ids(obs: Any) -> np.ndarray:
    """A tokens-mode observation's real ids, int64 (padding dropped by the mask, never by a pad id)."""
    return unpack_tokens(obs).astype(np.int64, copy=False)
