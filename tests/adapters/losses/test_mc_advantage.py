"""Group-relative advantages against loops and TRL's formula; GroupBuffer; top-k selection."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from gym_llm_adapters.losses import (
    AdvantageConfig,
    GroupBuffer,
    MCAdvantage,
    TopKRewardSelector,
    group_advantages,
    group_keys,
    select_rows,
)
from gym_llm_adapters.types import RolloutBatch, Trajectory


def make_batch(rewards, group_ids, rounds=None) -> RolloutBatch:
    B = len(rewards)
    S = 3
    return RolloutBatch(
        input_ids=np.arange(B * S).reshape(B, S), attention_mask=np.ones((B, S), np.int8),
        policy_mask=np.ones((B, S), np.int8), logprobs=np.zeros((B, S), np.float32),
        rewards=np.asarray(rewards, np.float32), group_ids=np.asarray(group_ids, np.int64),
        task_ids=np.asarray(group_ids, np.int64) + 100,
        rounds=np.zeros(B, np.int64) if rounds is None else np.asarray(rounds, np.int64),
        versions=np.zeros(B, np.int64))


def naive_advantages(rewards, keys, scale, eps=1e-4):
    out = []
    for r, k in zip(rewards, keys):
        group = [x for x, kk in zip(rewards, keys) if kk == k]
        if len(group) < 2:
            out.append(0.0)
            continue
        mean = sum(group) / len(group)
        std = {"group": statistics.stdev(group), "batch": statistics.stdev(rewards), "none": None}[scale]
        out.append(r - mean if std is None else (r - mean) / (std + eps))
    return out


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_matches_loops(scale) -> None:
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=12).round(2)
    keys = np.array([5, 5, 5, 9, 9, 9, 1, 1, 1, 7, 7, 7])
    np.testing.assert_allclose(group_advantages(rewards, keys, scale=scale), naive_advantages(list(rewards), keys,
                                                                                             scale), rtol=1e-6)


def test_matches_trl_formula() -> None:
    import torch
    from trl.trainer.utils import nanstd

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 2.0, -1.0])
    G = 4
    mean = rewards.view(-1, G).mean(1).repeat_interleave(G)
    std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G)
    trl_group = (rewards - mean) / (std + 1e-4)  # GRPOTrainer with scale_rewards="group"
    trl_batch = (rewards - mean) / (nanstd(rewards) + 1e-4)  # scale_rewards="batch"
    keys = np.repeat([0, 1], G)
    np.testing.assert_allclose(group_advantages(rewards.numpy(), keys), trl_group.numpy(), rtol=1e-5)
    np.testing.assert_allclose(group_advantages(rewards.numpy(), keys, scale="batch"), trl_batch.numpy(), rtol=1e-5)
    np.testing.assert_allclose(group_advantages(rewards.numpy(), keys, scale="none"), (rewards - mean).numpy())


def test_hand_values_constant_groups_and_singletons() -> None:
    adv = group_advantages(np.array([1.0, 0.0, 3.0, 3.0, 7.0]), np.array([0, 0, 1, 1, 2]))
    s = math.sqrt(0.5)  # Bessel std of {1, 0}
    np.testing.assert_allclose(adv, [0.5 / (s + 1e-4), -0.5 / (s + 1e-4), 0.0, 0.0, 0.0], rtol=1e-6)
    with pytest.raises(ValueError, match="finite"):
        group_advantages(np.array([1.0, np.nan]), np.array([0, 0]))
    with pytest.raises(ValueError, match="scale must be one of"):
        group_advantages(np.zeros(2), np.zeros(2), scale="std")


def test_mc_advantage_groups_by_group_and_round() -> None:
    batch = make_batch([1.0, 0.0, 1.0, 1.0], group_ids=[0, 0, 0, 0], rounds=[0, 0, 1, 1])
    out = MCAdvantage(AdvantageConfig(scale="none"))(batch)
    np.testing.assert_allclose(out.advantages, [0.5, -0.5, 0.0, 0.0])
    assert batch.advantages is None  # input untouched
    dropped = MCAdvantage(AdvantageConfig(drop_constant_groups=True))(batch)
    assert len(dropped) == 2 and np.array_equal(dropped.input_ids, batch.input_ids[:2])
    with pytest.raises(ValueError, match="group_size=3"):
        MCAdvantage(AdvantageConfig(group_size=3))(batch)
    assert group_keys(np.array([4, 4, 9]), np.array([0, 1, 0])).tolist() == [0, 1, 2]


def test_select_rows_copies_every_field() -> None:
    batch = make_batch([1.0, 2.0, 3.0], [0, 1, 2])
    batch.advantages = np.array([0.1, 0.2, 0.3], np.float32)
    sub = select_rows(batch, [2, 0])
    assert sub.rewards.tolist() == [3.0, 1.0] and sub.advantages.tolist() == pytest.approx([0.3, 0.1])
    assert sub.ref_logprobs is None and sub.input_ids.shape == (2, 3)


def trajectory(group_id, round_, reward) -> Trajectory:
    return Trajectory(task_id=group_id, group_id=group_id, round=round_, token_ids=np.zeros(2, np.int64),
                      policy_mask=np.array([0, 1], np.int8), logprobs=np.zeros(2, np.float32), prompt_length=1,
                      rewards=[reward], versions=[0], terminated=True, truncated=False)


def test_group_buffer_releases_complete_groups_in_order() -> None:
    buffer = GroupBuffer(2, max_pending_groups=2)
    a, b, c, d = trajectory(0, 0, 1.0), trajectory(1, 0, 0.0), trajectory(0, 1, 1.0), trajectory(1, 0, 1.0)
    assert buffer.add([a, b]) == [] and len(buffer) == 2
    assert buffer.add([c, d]) == [[b, d]] and len(buffer) == 2
    assert buffer.add([trajectory(0, 0, 0.5)])[0][0] is a
    with pytest.raises(RuntimeError, match="incomplete groups"):
        buffer.add([trajectory(5, 0, 0.0), trajectory(6, 0, 0.0)])
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        GroupBuffer(0)


def test_topk_keeps_best_per_group_stably() -> None:
    batch = make_batch([0.0, 1.0, 1.0, 0.5, 3.0, 2.0], group_ids=[0, 0, 0, 1, 1, 1])
    kept = TopKRewardSelector(2)(batch)
    assert kept.rewards.tolist() == [1.0, 1.0, 3.0, 2.0]  # original order; ties: earlier row wins
    assert TopKRewardSelector(1).indices(batch.rewards, group_keys(batch.group_ids)).tolist() == [1, 4]
    assert TopKRewardSelector(2, min_reward=1.5)(batch).rewards.tolist() == [3.0, 2.0]
    trajs = [trajectory(0, 0, 0.0), trajectory(0, 0, 2.0), trajectory(1, 0, 1.0)]
    assert TopKRewardSelector(1).select(trajs) == [trajs[1], trajs[2]]
    assert TopKRewardSelector(1).select([]) == []
    with pytest.raises(ValueError, match="group_size=3"):
        TopKRewardSelector(1, group_size=3)(make_batch([1.0, 2.0], [0, 0]))
    with pytest.raises(ValueError, match="k .* must be <= group_size"):
        TopKRewardSelector(4, group_size=3)


def test_topk_matches_sorting_loop() -> None:
    rng = np.random.default_rng(1)
    rewards = rng.integers(0, 4, 40).astype(float)
    keys = rng.integers(0, 6, 40)
    got = TopKRewardSelector(3).indices(rewards, keys).tolist()
    want = []
    for k in set(keys.tolist()):
        rows = [i for i in range(40) if keys[i] == k]
        want += sorted(rows, key=lambda i: (-rewards[i], i))[:3]
    assert got == sorted(want)
