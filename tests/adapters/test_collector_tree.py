"""Tree rollouts (``Collector(branch_turn=t)``, gym_llm_adapters.collector_tree) over real envs and a real engine:
each group's members share the leader's first turns exactly and go on on their own; every trajectory replays bit for
bit through a fresh env (so each branch is a true continuation of the shared state), and the shared turns are never
trained."""

from __future__ import annotations

from collections import defaultdict

import gymnasium as gym
import numpy as np
import pytest

import gym_llm  # noqa: F401  (registers the env ids)
from gym_llm_adapters.collector import Collector
from gym_llm_adapters.engines import SamplingConfig
from gym_llm_adapters.replay import replay
from gym_llm_adapters.rollout_io import RolloutWriter, read_rollouts

# Episodes take 1 + len(follow_ups) turns (1, 2, 3); the reward of a turn is the number of messages so far.
TASKS = [{"prompt": "Say hi.", "follow_ups": []},
         {"prompt": "Count to three.", "follow_ups": ["Again."]},
         {"prompt": "Name a colour.", "follow_ups": ["Another.", "One more."]}]
SAMPLING = SamplingConfig(max_tokens=12, temperature=1.0)


def reward_by_length(task, messages) -> float:  # importable, so the rollout file's env spec can be replayed
    return float(len(messages))


def tree_env(tok, mode: str, **kwargs):
    return gym.make_vec("LLMChat-v0", num_envs=8, group_size=4, vectorization_mode="vector_entry_point",
                        prompts=TASKS, mode=mode, tokenizer=tok, max_turns=3, max_seq_len=384, max_action_tokens=16,
                        reward_fn=reward_by_length, **kwargs)


@pytest.mark.parametrize("mode,branch_turn", [("tokens", 1), ("tokens", 2), ("text", 1)])
def test_tree_groups_share_their_first_turns_and_replay_exactly(tiny_tok, hf_engine, tmp_path, mode, branch_turn):
    envs = tree_env(tiny_tok, mode)
    path = tmp_path / "tree.jsonl"
    with RolloutWriter(path) as writer:
        collector = Collector(envs, hf_engine, SAMPLING, episodes_per_batch=8, seed=0, branch_turn=branch_turn,
                              writer=writer)
        batches = collector.collect(3)
        collector.close()
    groups = defaultdict(list)
    for trajectory in (t for batch in batches for t in batch):
        groups[(trajectory.group_id, trajectory.round)].append(trajectory)
    assert all(len(members) == 4 for members in groups.values())
    diverged = 0
    for members in groups.values():
        task = members[0].task_id
        turns = 1 + len(TASKS[task]["follow_ups"])
        shared = min(branch_turn, turns - 1)  # a leader that ends by the branch turn shares the turns before its last
        assert {(m.task_id, m.shared_turns) for m in members} == {(task, shared)}
        assert sorted(m.env_index % 4 for m in members) == [0, 1, 2, 3]
        for m in members:
            assert len(m.steps) == turns and m.rewards == [2.0 * t for t in range(1, turns + 1)]
            for a, b in zip(m.steps[:shared], members[0].steps[:shared]):  # the same records: one generation
                assert a.completion_ids.tolist() == b.completion_ids.tolist()
                assert a.prompt_ids.tolist() == b.prompt_ids.tolist() and a.logprobs.tolist() == b.logprobs.tolist()
            # the shared turns are context: no member trains on them
            assert m.turn_tokens[:shared] == [0] * shared
            own = sum(len(s.completion_ids) for s in m.steps[shared:])
            if m.token_exact:
                assert int(m.policy_mask.sum()) == own == sum(m.turn_tokens)
        if len({tuple(m.steps[shared].completion_ids.tolist()) for m in members}) > 1:
            diverged += 1
    assert diverged >= len(groups) // 2  # sampled at temperature 1: the members go their own ways after the branch
    assert len(read_rollouts(path)) == 24
    report = replay(path, env_kwargs={"reward_fn": reward_by_length})  # the scorer given, not imported from the file
    assert report.exact, report.summary()


def test_tree_settings_that_cannot_run_are_refused_naming_the_fix(tiny_tok, hf_engine):
    envs = tree_env(tiny_tok, "tokens")
    for kwargs, match in [({"branch_turn": 0, "episodes_per_batch": 8}, "int >= 1"),
                          ({"branch_turn": 1, "steps_per_batch": 8}, "episodes mode"),
                          ({"branch_turn": 1, "episodes_per_batch": 8, "overlap": True}, "overlap")]:
        with pytest.raises(ValueError, match=match):
            Collector(envs, hf_engine, SAMPLING, **kwargs)
    flat = gym.make_vec("LLMChat-v0", num_envs=2, group_size=1, vectorization_mode="vector_entry_point",
                        mode="tokens", tokenizer=tiny_tok, max_seq_len=384, max_action_tokens=16)
    with pytest.raises(ValueError, match="group_size"):
        Collector(flat, hf_engine, SAMPLING, episodes_per_batch=2, branch_turn=1)
    sync = gym.make_vec("LLMChat-v0", num_envs=2, vectorization_mode="sync", mode="tokens", tokenizer=tiny_tok,
                        max_seq_len=384, max_action_tokens=16)
    with pytest.raises(ValueError, match="native vector envs"):
        Collector(sync, hf_engine, SAMPLING, episodes_per_batch=2, branch_turn=1)
    collector = Collector(envs, hf_engine, SAMPLING, episodes_per_batch=8, branch_turn=1)
    with pytest.raises(ValueError, match="run_episodes"):
        collector.run_episodes()
    for env in (envs, flat, sync):
        env.close()


class CountingEngine:
    """The real engine, counting the completions it is asked for (how much a tree saves)."""

    def __init__(self, engine):
        self.engine, self.completions = engine, 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, sampling):
        self.completions += len(prompts)
        return self.engine.generate(prompts, sampling)


@pytest.mark.parametrize("branch_turn", [None, 1, 2])
def test_a_tree_generates_the_shared_turns_once_per_group(tiny_tok, hf_engine, branch_turn):
    engine = CountingEngine(hf_engine)
    collector = Collector(tree_env(tiny_tok, "tokens"), engine, SAMPLING, episodes_per_batch=8, seed=0,
                          branch_turn=branch_turn)
    trajectories = [t for batch in collector.collect(6) for t in batch]
    recorded = sum(len(t.steps) for t in trajectories)
    saved = sum(3 * t.shared_turns for t in trajectories if t.env_index % 4 == 0)  # G - 1 = 3 followers per group
    # Episode lengths are fixed by the tasks (1-3 turns), so every round of both groups ends together: nothing is in
    # flight when the sixth batch is out, and the count is exact.
    assert engine.completions == recorded - saved
    assert saved == {None: 0, 1: 24, 2: 36}[branch_turn]  # 48 trajectories: 12 groups, 4 of each task
    collector.close()


def test_the_trainer_trains_on_tree_groups(tmp_path):
    """``gym-llm train grpo --branch-turn 1`` end to end: GRPO steps on tree groups, the written rollouts replay."""
    from gym_llm_adapters.training import TrainConfig, Trainer

    cfg = TrainConfig(algorithm="grpo", env_id="LLMChat-v0", model="tiny", out_dir=tmp_path / "run", engine="hf",
                      device="cpu", env_kwargs={"prompts": TASKS, "max_turns": 3},
                      steps=2, num_tasks=2, group_size=4, branch_turn=1, max_new_tokens=12, max_seq_len=384,
                      learning_rate=1e-4, eval_every=0, save_every=100, progress=False)
    with Trainer(cfg) as trainer:
        result = trainer.run()
    assert result.steps == 2 and not result.interrupted
    trajectories = read_rollouts(cfg.out_dir / "rollouts.jsonl")
    assert len(trajectories) == 2 * 8
    for t in trajectories:
        assert t.shared_turns == min(1, len(TASKS[t.task_id]["follow_ups"]))
    assert replay(cfg.out_dir / "rollouts.jsonl").exact
