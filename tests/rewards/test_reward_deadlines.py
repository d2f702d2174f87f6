"""User-supplied reward hooks under a hard deadline (``with_deadline``): a hook that never returns costs one
sub-env its reward (0, with ``reward_error``), within the deadline, while the others are scored normally."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

import gym_llm  # noqa: F401
from gym_llm.rewards.deadline import with_deadline
from tests.rewards import hooks

DEADLINE_S = 1.0


def test_only_importable_functions_can_be_wrapped():
    with pytest.raises(ValueError, match="importable by name"):
        with_deadline(lambda task, messages: 1.0, DEADLINE_S)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        with_deadline(hooks.chat_reward, 0)
    assert "tests.rewards.hooks:chat_reward" in repr(with_deadline(hooks.chat_reward, DEADLINE_S))


def test_a_hanging_chat_reward_costs_one_sub_env_its_reward():
    envs = gym.make_vec("LLMChat-v0", num_envs=3, vectorization_mode="vector_entry_point",
                        prompts=[{"prompt": "Say hi."}], reward_fn=with_deadline(hooks.chat_reward, DEADLINE_S))
    try:
        envs.reset(seed=0)
        envs.step(("warm", "up", "now"))  # workers started outside the timed step
        envs.reset(seed=0)
        start = time.perf_counter()
        _, rewards, terminated, _, infos = envs.step(("hello", "HANG forever", "hi"))
        elapsed = time.perf_counter() - start
        final = infos["final_info"]
        assert elapsed < DEADLINE_S + 2.5, elapsed
        assert terminated.all() and list(rewards) == [2.0, 0.0, 2.0]
        assert final["_reward_error"].tolist() == [False, True, False]
        assert "DeadlineExceeded" in final["reward_error"][1]
    finally:
        envs.close()


def test_a_hanging_sequence_reward_in_the_tokens_env():
    env = gym.make("LLMTokens-v0", vocab_size=50, prompts=[[1, 2, 3]], eos_token_ids=[0], max_seq_len=32,
                   max_action_tokens=8, reward_fn=with_deadline(hooks.sequence_reward, DEADLINE_S))
    try:
        env.reset(seed=0)
        _, reward, _, _, info = env.step([4, 5])
        assert reward == 5.0 and "reward_error" not in info
        start = time.perf_counter()
        _, reward, _, _, info = env.step([7])
        assert time.perf_counter() - start < DEADLINE_S + 2.5
        assert reward == 0.0 and "DeadlineExceeded" in info["reward_error"]
    finally:
        env.close()


def test_a_hanging_terminal_reward_in_the_hashing_vector_env():
    envs = gym.make_vec("LLMHashing-v0", num_envs=2, vectorization_mode="vector_entry_point", vocab_size=50,
                        prompts=[[1, 2, 3]], eos_token_ids=[0], max_seq_len=16,
                        reward_fn=with_deadline(hooks.hashing_reward, DEADLINE_S))
    try:
        envs.reset(seed=0)
        envs.step(np.array([4, 7]))
        start = time.perf_counter()
        _, rewards, terminated, _, infos = envs.step(np.array([0, 0]))  # eos: both episodes end
        assert time.perf_counter() - start < DEADLINE_S + 2.5
        assert terminated.all() and list(rewards) == [2.0, 0.0]
        assert "DeadlineExceeded" in infos["final_info"]["reward_error"][1]
    finally:
        envs.close()
