"""Every registered env, its native vector env and Gymnasium's wrappers around them pickle as their configuration, and
roll out under ``AsyncVectorEnv`` with ``spawn`` and ``forkserver`` workers (multiprocessing, Ray and other trainers
need both)."""

from __future__ import annotations

import functools
import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv

import gym_llm  # noqa: F401
from tests.envs.cases import env_cases, make_kwargs
from tests.envs.spawn_helpers import make_env


def _configuration(env) -> tuple:
    """What a pickled copy must keep: spaces, the task source's size and first task, the env id, key settings."""
    base = env.unwrapped
    tasks = getattr(getattr(base, "parts", None), "tasks", None)
    first = tasks[0] if tasks is not None and len(tasks) else None
    return (str(base.observation_space), str(base.action_space), None if tasks is None else len(tasks),
            None if first is None else repr(first.data)[:500], getattr(getattr(env, "spec", None), "id", None),
            base.metadata.get("autoreset_mode"))


def _rollout(env, steps: int = 2) -> list:
    """Seeded reset and two steps of sampled actions: observations and rewards (comparable across copies)."""
    out = []
    obs, _ = env.reset(seed=3)
    env.action_space.seed(5)
    out.append(repr(obs)[:2000])
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        out.append((repr(obs)[:2000], np.asarray(reward).tolist(), np.asarray(terminated).tolist()))
        if np.all(terminated) or np.all(truncated):
            obs, _ = env.reset()
    return out


@pytest.mark.parametrize("env_id,case", env_cases())
@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
def test_pickles_to_the_same_configuration(env_id, case, vector):
    kwargs = make_kwargs(env_id, case)
    env = (gym.make_vec(env_id, num_envs=2, group_size=2, vectorization_mode="vector_entry_point", **kwargs)
           if vector else gym.make(env_id, **kwargs))
    try:
        copy = pickle.loads(pickle.dumps(env))
        try:
            assert type(copy) is type(env) and _configuration(copy) == _configuration(env)
            if vector:
                assert copy.num_envs == env.num_envs and copy.unwrapped.group_size == env.unwrapped.group_size
            assert _rollout(copy) == _rollout(env)  # the same env: the same seeded rollout
            again = pickle.loads(pickle.dumps(env))  # pickling mid-episode: a fresh copy, to reset like a new one
            again.close()
        finally:
            copy.close()
    finally:
        env.close()


def test_an_unpicklable_argument_is_named_with_the_fix():
    env = gym.make("LLMChat-v0", reward_fn=lambda task, messages: 1.0)
    try:
        with pytest.raises(TypeError, match=r"argument 'reward_fn'.*importable function"):
            pickle.dumps(env)
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_every_env_rolls_out_under_async_vector_env(context):
    """Two steps of every id (its first case) in an AsyncVectorEnv worker started with ``spawn`` (the env crosses
    by pickle into a fresh interpreter; one worker per id: each is an interpreter start and import of ~0.7 CPU-s);
    with ``forkserver`` (the same pickling path, from a fork server) two ids, one of them with a live tool."""
    seen = set()
    for env_id, case in env_cases():
        if env_id in seen:
            continue
        seen.add(env_id)
        kwargs = make_kwargs(env_id, case)
        if context == "forkserver" and env_id not in ("LLMChat-v0", "LLMPythonTool-v0"):
            continue
        envs = AsyncVectorEnv([functools.partial(make_env, env_id, kwargs)], context=context,
                              autoreset_mode="NextStep")
        try:
            envs.reset(seed=0)
            envs.action_space.seed(0)
            for _ in range(2):
                _, rewards, *_ = envs.step(envs.action_space.sample())
                assert rewards.shape == (1,)
        finally:
            envs.close()


def test_tools_pickle_as_their_configuration_too():
    """An env given a tool object (a live sandbox pool) pickles; the copy gets a tool of the same settings."""
    from gym_llm.tools import PythonTool
    from tests.envs.cases import _gsm8k

    tool = PythonTool(timeout_s=5.0, min_idle=0)
    env = gym.make("LLMPythonTool-v0", python_tool=tool, **_gsm8k())
    try:
        env.reset(seed=0)
        copy = pickle.loads(pickle.dumps(env))
        try:
            copy.reset(seed=0)
            _, _, _, _, info = copy.step("```python\nprint(6 * 7)\n```")
            assert '"status": "ok"' in info["tool_calls"]
            tool_copy = copy.unwrapped._constructor[2]["python_tool"]
            assert tool_copy is not tool and tool_copy._constructor[2] == {"timeout_s": 5.0, "min_idle": 0}
        finally:
            copy.close()
    finally:
        env.close()
