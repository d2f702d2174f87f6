"""Search over turns (gym_llm_adapters.search) on a real env and engine: the tree keeps the best reply of every turn
and its path is a true episode (it replays through a fresh env), flat sampling keeps whole episodes, both spend the
same budget, and with a per-turn reward the tree solves more at that budget (first principles: with per-turn
success p, the tree needs one right reply per turn, flat one episode right at every turn)."""

from __future__ import annotations

import hashlib

import gymnasium as gym
import numpy as np
import pytest

import gym_llm  # noqa: F401  (registers the env ids)
from gym_llm_adapters.engines import SamplingConfig
from gym_llm_adapters.search import best_of_k_per_turn, independent_episodes

TURNS = 3
TASKS = [{"prompt": f"Question {i}.", "follow_ups": ["Next.", "Last one."]} for i in range(16)]
SAMPLING = SamplingConfig(max_tokens=6, temperature=1.0, seed=0)


def coin_reward(task, messages) -> float:
    """1.0 for about half of all replies: a hash bit of the reply text (random as the sampled reply is)."""
    return float(hashlib.sha256(messages[-1].content.encode()).digest()[0] & 1)


def quiz_env(engine, *, mode: str = "tokens", k: int = 4, tasks=TASKS, **kwargs):
    return gym.make_vec("LLMChat-v0", num_envs=len(tasks) * k, group_size=k, vectorization_mode="vector_entry_point",
                        prompts=tasks, task_order="sequential", task_assignment="partition", mode=mode,
                        tokenizer=engine.tokenizer,
                        max_turns=TURNS, max_seq_len=512, max_action_tokens=8, reward_fn=coin_reward, **kwargs)


def replay(engine, outcome) -> list[float]:
    """The path's replies fed to a fresh scalar env on the same task: the rewards it gives."""
    env = gym.make("LLMChat-v0", prompts=TASKS, mode="text", tokenizer=engine.tokenizer, max_turns=TURNS,
                   max_seq_len=512, reward_fn=coin_reward)
    env.reset(seed=0, options={"task_id": outcome.task_id})
    rewards, ended = [], False
    for reply in outcome.replies:
        assert not ended
        _, reward, terminated, truncated, _ = env.step(reply)
        rewards.append(float(reward))
        ended = terminated or truncated
    env.close()
    assert ended, "the path is a whole episode"
    return rewards


@pytest.mark.parametrize("autoreset", ["SameStep", "NextStep", "Disabled"])
def test_the_tree_keeps_the_best_reply_of_each_turn_and_its_path_is_a_real_episode(hf_engine, autoreset):
    seen: list[np.ndarray] = []

    def select(rewards):
        seen.append(rewards.copy())
        return int(np.argmax(rewards))

    with quiz_env(hf_engine, mode="text", autoreset_mode=autoreset) as envs:
        outcomes = best_of_k_per_turn(envs, hf_engine, SAMPLING, seed=0, select=select)
        assert not envs.unwrapped.paused.any()  # left unpaused
    G = len(TASKS)
    assert sorted(o.task_id for o in outcomes) == list(range(G))  # each task once (a rotation of the sequence)
    assert len(seen) == TURNS * G and all(s.shape == (4,) for s in seen)
    for g, outcome in enumerate(outcomes):
        assert outcome.rewards == tuple(float(seen[t * G + g].max()) for t in range(TURNS))  # turn-major calls
        assert outcome.generations == 4 * TURNS and outcome.generated_tokens > 0
        assert replay(hf_engine, outcome) == list(outcome.rewards)  # each turn continued the kept reply's episode
    rates = np.concatenate(seen)
    assert 0.2 < rates.mean() < 0.8  # the coin is a coin: the comparison below means something


def test_flat_sampling_keeps_whole_episodes_and_spends_the_same_budget(hf_engine):
    with quiz_env(hf_engine, mode="text") as envs:
        flat = independent_episodes(envs, hf_engine, SAMPLING, seed=0)
    for outcome in flat:
        assert outcome.generations == 4 * TURNS and len(outcome.rewards) == TURNS
        assert replay(hf_engine, outcome) == list(outcome.rewards)


def test_with_a_per_turn_reward_the_tree_solves_more_at_the_same_budget(hf_engine):
    # p ~ 1/2, T = 3, k = 4: flat solves 1 - (1 - p^3)^4 ~ 41%, the tree (1 - (1 - p)^4)^3 ~ 82% of problems. Over
    # 96 problems the difference's standard error is ~6.7 points, so "tree > flat + 10 points" sits ~4.6 of them
    # below the expected 41; it fails if the tree does not choose (keeping a random reply solves p^3 ~ 12%).
    tasks = TASKS * 6
    with quiz_env(hf_engine, tasks=tasks) as envs:
        tree = best_of_k_per_turn(envs, hf_engine, SAMPLING, seed=1)
    with quiz_env(hf_engine, tasks=tasks) as envs:
        flat = independent_episodes(envs, hf_engine, SAMPLING, seed=1)
    solved = {name: np.mean([o.episode_return == TURNS for o in outcomes])
              for name, outcomes in (("tree", tree), ("flat", flat))}
    assert [o.generations for o in tree] == [o.generations for o in flat] == [4 * TURNS] * len(tasks)
    assert solved["tree"] > solved["flat"] + 0.10, solved


def test_bad_settings_are_refused_with_the_fix(hf_engine):
    with quiz_env(hf_engine, k=1) as envs:
        with pytest.raises(ValueError, match="group_size=k"):
            best_of_k_per_turn(envs, hf_engine, SAMPLING)
    with quiz_env(hf_engine) as envs:  # a reply longer than the env accepts would be cut: refused up front
        with pytest.raises(ValueError, match="max_action_tokens"):
            best_of_k_per_turn(envs, hf_engine, SamplingConfig(max_tokens=9))
    with quiz_env(hf_engine) as envs:
        with pytest.raises(ValueError, match="n=1"):
            independent_episodes(envs, hf_engine, SamplingConfig(n=2, max_tokens=4))
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("LLMChat-v0", prompts=TASKS, tokenizer=hf_engine.tokenizer,
                                                      mode="tokens", max_seq_len=256, max_action_tokens=8)] * 2)
    with pytest.raises(ValueError, match="vector_entry_point"):
        best_of_k_per_turn(sync, hf_engine, SAMPLING)
    sync.close()
