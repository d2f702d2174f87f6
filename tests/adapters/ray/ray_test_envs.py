"""Envs and checks shared by the Ray tests. Ray pickles this module by value, so actors need not import it."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

import gymnasium as gym
import numpy as np
import ray.cloudpickle

import gym_llm  # noqa: F401  (registers the env ids)
from gym_llm_adapters.engines import HFEngine, SamplingConfig
from gym_llm_adapters.ray import EnvSpec
from gym_llm_adapters.types import Trajectory

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

# Episodes take 1 + len(follow_ups) turns; the reward of turn t is len(messages) = 2t.
TASKS = [{"prompt": "Say hi.", "follow_ups": []},
         {"prompt": "Count to three.", "follow_ups": ["Again."]},
         {"prompt": "Name a colour.", "follow_ups": ["Another.", "One more."]}]
SAMPLING = SamplingConfig(max_tokens=12, temperature=1.0)


def reward_fn(task, messages) -> float:
    return float(len(messages))


def chat_kwargs(tok, **kwargs) -> dict:
    return dict(vectorization_mode="vector_entry_point", mode="tokens", tokenizer=tok, max_turns=3, max_seq_len=384,
                max_action_tokens=16, reward_fn=reward_fn, **{"prompts": TASKS, **kwargs})


def keep_talking(messages, task) -> str | None:
    """A user who goes on while the assistant's last reply has an even number of characters. Members of a group
    sample different replies, so they end their episodes at different turns (1 to ``max_turns``)."""
    return None if len(messages[-1].content) % 2 else "Go on."


def variable_chat_env(*, num_envs: int, tok, group_size: int = 2, crash_flag: str | None = None):
    """The chat env with one open-ended task (``keep_talking``): episodes of one group end at different steps.
    With ``crash_flag``, the first worker to see a group split crashes (:class:`CrashWhenGroupSplits`)."""
    env = gym.make_vec("LLMChat-v0", num_envs=num_envs, group_size=group_size,
                       **chat_kwargs(tok, prompts=[{"prompt": "Talk to me."}], user_simulator=keep_talking))
    return env if crash_flag is None else CrashWhenGroupSplits(env, crash_flag)


class CrashWhenGroupSplits(gym.vector.VectorWrapper):
    """After a step that left some group split (a member has finished a round that another member is still
    playing, so the driver holds part of that group), the next step ends the process with ``os._exit`` — in the
    first process to claim the file ``flag`` only; it first writes there how many finished episodes of
    incomplete groups it had reported (what the driver must count as orphaned). Other processes never crash."""

    def __init__(self, env, flag: str):
        super().__init__(env)
        self.flag = flag
        self.finished = np.zeros(env.num_envs, dtype=np.int64)  # episodes finished per sub-env (= its round)

    def orphans(self) -> int:
        G, total = self.env.unwrapped.group_size, 0
        for g in range(len(self.finished) // G):
            counts = self.finished[g * G:(g + 1) * G]
            for round_ in range(int(counts.max())):
                members = int((counts > round_).sum())  # members that finished this round
                total += members if members < G else 0
        return total

    def step(self, actions):
        orphans = self.orphans()
        if orphans and claim(self.flag):
            with open(self.flag, "w") as f:
                f.write(str(orphans))
            os._exit(1)
        result = self.env.step(actions)
        self.finished += np.asarray(result[2]) | np.asarray(result[3])
        return result


def chat_spec(tok, *, num_envs: int = 4, group_size: int = 2, **kwargs) -> EnvSpec:
    return EnvSpec("LLMChat-v0", num_envs=num_envs, group_size=group_size, **chat_kwargs(tok, **kwargs))


def local_chat_env(tok, *, num_envs: int = 4, group_size: int = 2):
    return gym.make_vec("LLMChat-v0", num_envs=num_envs, group_size=group_size, **chat_kwargs(tok))


class FailOnStep(gym.vector.VectorWrapper):
    """Fails inside step number ``crash_on_step``: the first process to create the file ``flag`` ends itself with
    ``os._exit``; every later one hangs (a stuck tool or verifier), or with ``later_hang=False`` runs on."""

    def __init__(self, env, crash_on_step: int, flag: str, later_hang: bool = True):
        super().__init__(env)
        self.crash_on_step, self.flag, self.later_hang, self.steps = crash_on_step, flag, later_hang, 0

    def step(self, actions):
        self.steps += 1
        if self.steps == self.crash_on_step:
            if claim(self.flag):
                os._exit(1)
            if self.later_hang:
                time.sleep(3600)
        return self.env.step(actions)


def failing_chat_env(*, num_envs: int, tok, crash_on_step: int, flag: str, group_size: int = 2,
                     later_hang: bool = True):
    return FailOnStep(local_chat_env(tok, num_envs=num_envs, group_size=group_size), crash_on_step, flag, later_hang)


def claim(flag: str) -> bool:
    """True in the first process that creates the file ``flag``."""
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


class FlakyHFEngine(HFEngine):
    """The real transformers engine with one injected failure: sampled (temperature > 0: the collector's, not a
    test's greedy checks) generate call number ``fail_on_call`` of the first process to claim ``flag`` raises."""

    def __init__(self, *args, fail_on_call: int, flag: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.fail_on_call, self.flag = 0, fail_on_call, flag

    def _generate_ids(self, prompts, sampling):
        self.calls += sampling.temperature > 0
        if sampling.temperature > 0 and self.calls == self.fail_on_call and claim(self.flag):
            raise RuntimeError("injected engine failure")
        return super()._generate_ids(prompts, sampling)


def reference_that_stalls_once(path: str, flag: str):
    """The tiny checkpoint as a reference model whose first forward stalls for a minute in the first process to
    claim ``flag``: a call to it is surely still running when the test kills that process."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.base_model.register_forward_pre_hook(lambda module, args: time.sleep(60) if claim(flag) else None)
    return model


def expected_rewards(task_id: int) -> list[float]:
    return [2.0 * t for t in range(1, 2 + len(TASKS[task_id]["follow_ups"]))]


def check_complete(trajectory: Trajectory, engine, *, fixed_length: bool = True) -> None:
    """A whole, token-exact episode: every turn's reward, only the last step ends it, consistent tokens/masks, and
    log-probs that the weights that sampled each step recompute by teacher forcing: ``engine``, or
    ``engine[version]`` when it is a dict (an episode may span a weight push; its versions never go down).
    ``fixed_length``: an episode of ``TASKS`` (its length is the task's); else of ``variable_chat_env``."""
    steps = trajectory.steps
    assert trajectory.token_exact and trajectory.terminated != trajectory.truncated
    assert [s.terminated or s.truncated for s in steps] == [False] * (len(steps) - 1) + [True]
    assert trajectory.rewards == [2.0 * t for t in range(1, len(steps) + 1)]
    if fixed_length:
        assert trajectory.terminated and trajectory.rewards == expected_rewards(trajectory.task_id)
    else:
        assert len(steps) <= 3 and (len(steps) == 3 or not trajectory.truncated)  # max_turns=3 truncates
    assert [s.turn for s in trajectory.steps] == list(range(1, len(trajectory.steps) + 1))
    assert all(s.env_index == trajectory.env_index and s.group_id == trajectory.group_id for s in trajectory.steps)
    sequence, sampled = trajectory.token_ids, trajectory.policy_mask.astype(bool)
    for step in trajectory.steps:  # every turn conditioned on a prefix of the sequence
        n, k = len(step.prompt_ids), len(step.completion_ids)
        assert sequence[:n].tolist() == step.prompt_ids.tolist()
        assert sequence[n: n + k].tolist() == step.completion_ids.tolist() and sampled[n: n + k].all()
    assert sampled.sum() == sum(len(s.completion_ids) for s in trajectory.steps)
    assert trajectory.logprobs[sampled].tolist() == np.concatenate([s.logprobs for s in trajectory.steps]).tolist()
    assert trajectory.versions == sorted(trajectory.versions) == [s.version for s in steps]
    engines = engine if isinstance(engine, dict) else {v: engine for v in trajectory.versions}
    teacher = {v: engines[v].logprobs([trajectory.token_ids])[0] for v in set(trajectory.versions)}
    for step in steps:
        n, k = len(step.prompt_ids), len(step.completion_ids)
        np.testing.assert_allclose(teacher[step.version][n: n + k], step.logprobs, atol=1e-4)


def check_groups(batch: list[Trajectory], group_size: int) -> None:
    counts = Counter((t.group_id, t.round) for t in batch)
    assert set(counts.values()) == {group_size}, counts
    for key in counts:
        members = [t for t in batch if (t.group_id, t.round) == key]
        assert len({t.task_id for t in members}) == 1
        assert len({t.env_index for t in members}) == group_size


def assert_same_trajectory(got: Trajectory, want: Trajectory) -> None:
    for name in ("env_index", "group_id", "round", "task_id", "rewards", "versions", "terminated", "truncated",
                 "prompt_length", "token_exact"):
        assert getattr(got, name) == getattr(want, name), name
    assert got.token_ids.tolist() == want.token_ids.tolist()
    assert got.policy_mask.tolist() == want.policy_mask.tolist()
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
    for a, b in zip(got.steps, want.steps, strict=True):
        assert (a.prompt_text, a.completion_text, a.finish_reason, a.info) == (b.prompt_text, b.completion_text,
                                                                                b.finish_reason, b.info)


def run_until(collector, done, timeout_s: float = 180.0) -> list:
    """Batches until ``done(collector, batches)`` holds (bounded, so a regression fails instead of hanging).
    The live workers keep delivering while a replacement starts, so this may take many batches."""
    batches, start = [], time.monotonic()
    while not done(collector, batches):
        assert time.monotonic() - start < timeout_s, collector.stats
        batches.append(collector.next_batch())
    return batches
