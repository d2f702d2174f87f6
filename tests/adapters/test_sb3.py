"""Stable-Baselines3 and the envs: its env checker on every registered env, and a PPO run that learns on
LLMHashing-v0 (the env whose spaces SB3's algorithms can train on; docs/peers.md says why the others cannot)."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_checker import check_env

import gym_llm
from tests.envs.cases import cases_of

TOKENS_CASES = [(info.id, case) for info in gym_llm.ENVS for case in cases_of(info.id)
                if case in ("tokens", "ids-only")]
DICT_ACTION = "The action space is not based off a numpy array"  # SB3's warning: its algorithms take no Dict action


def sb3_warnings(env) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, warn=True)
    return [str(w.message) for w in caught if "stable_baselines3" in (w.filename or "")]


@pytest.mark.parametrize("env_id,case", TOKENS_CASES, ids=[f"{i}-{c}" for i, c in TOKENS_CASES])
def test_sb3_env_checker_passes_in_tokens_mode(env_id, case):
    env = gym.make(env_id, **cases_of(env_id)[case]())
    try:
        found = sb3_warnings(env)
    finally:
        env.close()
    if env_id == "LLMHashing-v0":  # Discrete action, Dict of arrays observation: nothing SB3 warns about
        assert found == []
    else:  # a reply is a Dict(input_ids, attention_mask) action, which SB3's algorithms do not take
        assert len(found) == 1 and found[0].startswith(DICT_ACTION), found


@pytest.fixture(autouse=True)
def _sb3_logs_in_tmp(tmp_path, monkeypatch):
    """SB3's default logger makes a folder in the system temp dir per model (/tmp/SB3-<date>): keep it in tmp_path."""
    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path / "sb3"))


def test_sb3_env_checker_refuses_text_mode_with_its_reason():
    env = gym.make("LLMGSM8K-v0", source="arithmetic")
    with pytest.raises(AssertionError, match="must be a numpy array"):
        check_env(env)
    env.close()


def test_ppo_learns_to_pick_the_rewarded_token_on_the_hashing_env():
    """A one-token episode whose reward is 1 when the token is 7 (of 50): PPO's probability of 7 rises from ~1/50."""
    torch.manual_seed(0)
    env = gym.make("LLMHashing-v0", vocab_size=50, prompts=[[1, 2, 3], [4]], eos_token_ids=[0], max_seq_len=16,
                   max_new_tokens=1, reward_fn=lambda task, ids, prompt_length: float(ids[-1] == 7))
    model = PPO("MultiInputPolicy", env, n_steps=128, batch_size=64, n_epochs=4, learning_rate=3e-3, seed=0,
                device="cpu")

    def p7() -> float:
        obs, _ = env.reset(seed=1)
        with torch.no_grad():
            return float(model.policy.get_distribution(model.policy.obs_to_tensor(obs)[0]).distribution.probs[0, 7])

    before = p7()
    model.learn(512)
    after = p7()
    assert before < 0.05 and after > 0.3, (before, after)
    env.close()
