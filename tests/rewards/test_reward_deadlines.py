"""User-supplied reward hooks under a hard deadline: every env runs ``reward_fn`` in a deadline worker process
(``reward_timeout_s``, default 30 s; ``with_deadline`` names one by import path). A hook that never returns costs one
sub-env its reward (0, with ``reward_error``), within the deadline, while the others are scored normally."""

from __future__ import annotations

import threading
import time

import gymnasium as gym
import numpy as np
import pytest

import gym_llm  # noqa: F401
from gym_llm.rewards.deadline import DEFAULT_HOOK_TIMEOUT_S, IsolatedHook, with_deadline
from tests.rewards import hooks

DEADLINE_S = 2.5  # the hooks that answer must answer within it on a loaded machine (xdist beside vLLM runs)


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
        assert elapsed < DEADLINE_S + 5, elapsed
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
        assert time.perf_counter() - start < DEADLINE_S + 5
        assert reward == 0.0 and "DeadlineExceeded" in info["reward_error"]
    finally:
        env.close()


def test_a_hanging_terminal_reward_in_the_hashing_vector_env():
    envs = gym.make_vec("LLMHashing-v0", num_envs=2, vectorization_mode="vector_entry_point", vocab_size=50,
                        prompts=[[1, 2, 3]], eos_token_ids=[0], max_seq_len=16,
                        reward_fn=with_deadline(hooks.hashing_reward, DEADLINE_S))
    try:
        envs.reset(seed=0)
        envs.step(np.array([0, 0]))  # warm: both episodes end and are scored (the workers start outside the timing)
        envs.step(np.array([4, 7]))
        start = time.perf_counter()
        _, rewards, terminated, _, infos = envs.step(np.array([0, 0]))  # eos: both episodes end
        assert time.perf_counter() - start < DEADLINE_S + 5
        assert terminated.all() and list(rewards) == [2.0, 0.0]
        assert "DeadlineExceeded" in infos["final_info"]["reward_error"][1]
    finally:
        envs.close()


# ---- the default: every reward_fn runs under a deadline, lambdas and closures included ----


def test_every_env_puts_its_reward_hook_under_the_default_deadline():
    chat = gym.make("LLMChat-v0", prompts=["Hi"], reward_fn=lambda task, messages: 1.0)
    gsm8k = gym.make("LLMGSM8K-v0", source="arithmetic", num_generated=4, reward_fn=lambda task, messages: 0.5)
    tokens = gym.make("LLMTokens-v0", vocab_size=10, prompts=[[1]], reward_fn=lambda task, seq, done: 1.0)
    hashing = gym.make("LLMHashing-v0", vocab_size=10, prompts=[[1]], max_seq_len=4,
                       reward_fn=lambda task, ids, n: 1.0)
    hooks_ = [episode_common(chat).handler.reward_fn, episode_common(gsm8k).handler.reward_fn,
              episode_common(tokens).reward_fn, episode_common(hashing).reward_fn]
    assert all(isinstance(h, IsolatedHook) and h.timeout_s == DEFAULT_HOOK_TIMEOUT_S for h in hooks_), hooks_
    opted_out = gym.make("LLMChat-v0", prompts=["Hi"], reward_fn=len, reward_timeout_s=None)
    assert episode_common(opted_out).handler.reward_fn is len


def episode_common(env):
    env.reset(seed=0)
    return env.unwrapped._episode.common


def test_a_hanging_lambda_is_killed_at_reward_timeout_s_and_the_next_step_is_scored():
    env = gym.make("LLMChat-v0", prompts=["Hi"], max_turns=1, reward_timeout_s=DEADLINE_S,
                   reward_fn=lambda task, messages: time.sleep(3600) if "HANG" in messages[-1].content else 2.5)
    env.reset(seed=0)
    assert env.step("warm")[1] == 2.5  # the worker started outside the timed step
    env.reset()
    start = time.perf_counter()
    _, reward, terminated, _, info = env.step("HANG")
    assert time.perf_counter() - start < DEADLINE_S + 5
    assert terminated and reward == 0.0 and "DeadlineExceeded" in info["reward_error"]
    env.reset()
    assert env.step("fine")[1] == 2.5  # a fresh worker


def test_a_closure_sees_what_it_captured_and_its_exception_comes_back_as_itself():
    class Refused(Exception):
        pass

    wanted = {"answer": "42"}

    def reward_fn(task, messages):
        if messages[-1].content == "boom":
            raise Refused("judge refused")
        return float(messages[-1].content == wanted["answer"])

    env = gym.make("LLMChat-v0", prompts=["Hi"], max_turns=1, reward_fn=reward_fn)
    env.reset(seed=0)
    assert env.step("42")[1] == 1.0
    env.reset()
    with pytest.raises(Refused, match="judge refused") as caught:
        env.step("boom")
    assert any("deadline worker" in note for note in caught.value.__notes__)


def test_state_a_hook_mutates_stays_in_its_worker_unless_it_opts_out():
    seen = []

    def counting(task, messages):
        seen.append(messages[-1].content)
        return float(len(seen))

    isolated = gym.make("LLMChat-v0", prompts=["Hi"], max_turns=1, reward_fn=counting)
    inline = gym.make("LLMChat-v0", prompts=["Hi"], max_turns=1, reward_fn=counting, reward_timeout_s=None)
    isolated.reset(seed=0)
    isolated.step("a")
    assert seen == []  # documented: the worker's copy of the list grew, not this one
    inline.reset(seed=0)
    assert inline.step("b")[1] == 1.0 and seen == ["b"]


def test_a_hook_that_cannot_be_sent_to_a_worker_is_refused_when_the_env_is_built():
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"cannot be pickled.*reward_timeout_s=None"):
        gym.make("LLMChat-v0", prompts=["Hi"], reward_fn=lambda task, messages: float(lock.locked()))
    with pytest.raises(ValueError, match="reward_timeout_s must be a number of seconds > 0"):
        gym.make("LLMChat-v0", prompts=["Hi"], reward_fn=len, reward_timeout_s=0)


def test_a_hanging_lambda_in_one_sub_env_of_a_vector_step():
    envs = gym.make_vec("LLMChat-v0", num_envs=3, vectorization_mode="vector_entry_point", max_turns=1,
                        prompts=[{"prompt": "Say hi."}], reward_timeout_s=DEADLINE_S,
                        reward_fn=lambda task, messages: time.sleep(3600) if "HANG" in messages[-1].content else 1.0)
    try:
        envs.reset(seed=0)
        envs.step(("warm", "up", "now"))
        start = time.perf_counter()
        _, rewards, terminated, _, infos = envs.step(("hello", "HANG", "hi"))
        assert time.perf_counter() - start < DEADLINE_S + 5
        assert terminated.all() and list(rewards) == [1.0, 0.0, 1.0]
        assert infos["final_info"]["_reward_error"].tolist() == [False, True, False]
    finally:
        envs.close()


def test_a_worker_that_dropped_a_hook_gets_it_again():
    """A worker keeps the 32 newest hooks it was sent; an older one is sent again when it comes back."""
    envs = [gym.make("LLMChat-v0", prompts=["Hi"], max_turns=1, reward_fn=lambda task, messages, k=k: float(k))
            for k in range(40)]
    for _ in range(2):
        for k, env in enumerate(envs):
            env.reset(seed=0)
            assert env.step("hi")[1] == float(k)


def test_idle_workers_stop_with_the_process_that_started_them():
    """A pool nobody closed: its idle workers are stopped at interpreter exit (no orphan, no ResourceWarning)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("from gym_llm.rewards.deadline import WorkerPool\n"
            "pool = WorkerPool(max_idle=2)\n"
            "pool.warm(2)\n"
            "print(' '.join(str(w.process.pid) for w in pool._idle), flush=True)\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", code], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 0, done.stderr[-2000:]
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2 and "ResourceWarning" not in done.stderr, done.stderr[-2000:]
    for pid in pids:  # reaped by the exiting parent: no such process (or, at most, a zombie of its reaper)
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "zombie" in status.read_text(), status.read_text()
