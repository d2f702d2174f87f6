"""LLMTokens-v0: concatenation, eos/stop termination, length truncation, reward hook."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import gym_llm  # noqa: F401
from gym_llm.core.spaces import unpack_tokens


def test_token_ids_concatenate_and_eos_terminates():
    rewards = []
    env = gym.make("LLMTokens-v0", vocab_size=100, prompts=[[5, 6, 7]], eos_token_ids=[0], max_seq_len=16,
                   max_action_tokens=4, reward_fn=lambda task, seq, done: rewards.append((seq.tolist(), done)) or float(done),
                   reward_timeout_s=None)  # the hook records into this test's list: run it in the env's thread
    obs, info = env.reset(seed=0)
    assert unpack_tokens(obs).tolist() == [5, 6, 7]
    obs, reward, terminated, truncated, info = env.step([8, 9])
    assert unpack_tokens(obs).tolist() == [5, 6, 7, 8, 9] and not terminated and reward == 0.0
    assert info["policy_mask"][:5].tolist() == [0, 0, 0, 1, 1]
    obs, reward, terminated, truncated, info = env.step(np.array([10, 0]))
    assert terminated and not truncated and reward == 1.0
    assert rewards[-1] == ([5, 6, 7, 8, 9, 10, 0], True)


def test_length_and_max_steps_truncate():
    env = gym.make("LLMTokens-v0", vocab_size=10, prompts=[[1]], max_seq_len=5, max_action_tokens=3)
    env.reset(seed=0)
    assert env.step([2, 3])[3] is False
    obs, _, terminated, truncated, _ = env.step([4, 5, 6])  # only 2 fit
    assert truncated and not terminated and unpack_tokens(obs).tolist() == [1, 2, 3, 4, 5]
    env = gym.make("LLMTokens-v0", vocab_size=10, prompts=[[1]], max_steps=2)
    env.reset(seed=0)
    assert env.step([2])[3] is False and env.step([2])[3] is True


def test_text_mode_stop_strings(tiny_tok):
    env = gym.make("LLMTokens-v0", mode="text", prompts=["Once"], stop_strings=["<END>"], max_chars=40)
    obs, _ = env.reset(seed=0)
    assert obs == "Once"
    obs, _, terminated, _, _ = env.step(" upon")
    assert obs == "Once upon" and not terminated
    assert env.step(" a time<END>")[2]


def test_tokenizer_prompts_and_chat_template(tiny_tok):
    env = gym.make("LLMTokens-v0", tokenizer=tiny_tok, prompts=["Hello"], apply_chat_template=True,
                   max_seq_len=64, max_action_tokens=8)
    obs, _ = env.reset(seed=0)
    assert tiny_tok.decode(unpack_tokens(obs)) == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    _, _, terminated, _, _ = env.step([tiny_tok.eos_token_id])
    assert terminated  # the tokenizer's eos ends the episode by default


def test_bad_prompts():
    with pytest.raises(ValueError, match="must be a str, a list of token ids"):
        gym.make("LLMTokens-v0", prompts=[3.5])
    with pytest.raises(ValueError, match="needs tokenizer= or vocab_size="):
        gym.make("LLMTokens-v0", mode="tokens", prompts=["x"])
    env = gym.make("LLMTokens-v0", vocab_size=4, prompts=[[9]])
    with pytest.raises(ValueError, match="outside"):
        env.reset(seed=0)
