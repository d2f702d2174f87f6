"""sft_dataset: which episodes are kept (top-k per group, reward threshold) and how they are written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gym_llm_adapters.rollout_io import RolloutWriter
from gym_llm_adapters.trl import select_rollouts, sft_dataset, sft_rows
from gym_llm_adapters.types import StepRecord, Trajectory


def episode(group: int, round_: int, reward: float, index: int, *, messages: bool = True) -> Trajectory:
    """A 2-turn episode: prompt (3) + sampled (2) + env (2) + sampled (1) tokens."""
    ids = np.arange(8, dtype=np.int64) + 10 * index
    mask = np.array([0, 0, 0, 1, 1, 0, 0, 1], dtype=np.int8)
    info = {"messages": json.dumps([{"role": "user", "content": f"q{index}"}, {"role": "assistant", "content": "a"},
                                    {"role": "tool", "content": "4", "name": "python"},
                                    {"role": "assistant", "content": "#### 4"}])} if messages else {}
    steps = [StepRecord(index, 7, group, round_, 1, ids[:3], ids[3:5], np.zeros(2, np.float32), 0.0, False, False, 0),
             StepRecord(index, 7, group, round_, 2, ids[:7], ids[7:], np.zeros(1, np.float32), reward, True, False, 0,
                        info=info)]
    return Trajectory(task_id=7, group_id=group, round=round_, token_ids=ids, policy_mask=mask,
                      logprobs=np.where(mask == 1, -0.5, 0.0).astype(np.float32), prompt_length=3, rewards=[0.0, reward],
                      versions=[0, 0], terminated=True, truncated=False, steps=steps, env_index=index)


REWARDS = [0.0, 1.0, 1.0, 0.5,   # group 0, round 0
           0.2, 0.1, 0.0, 0.0,   # group 1, round 0
           1.0, 0.0, 0.0, 0.0]   # group 0, round 1: another group


@pytest.fixture
def rollouts():
    return [episode(i // 4 % 2 if i < 8 else 0, i // 8, r, i) for i, r in enumerate(REWARDS)]


def test_selection(rollouts, tmp_path):
    def kept(**kwargs):
        return [t.env_index for t in select_rollouts(rollouts, **kwargs)]

    assert kept() == list(range(12))
    assert kept(top_k=1) == [1, 4, 8]  # ties go to the earlier episode
    assert kept(top_k=2) == [1, 2, 4, 5, 8, 9]
    assert kept(min_reward=0.5) == [1, 2, 3, 8]
    assert kept(top_k=1, min_reward=0.5) == [1, 8]
    RolloutWriter(tmp_path / "r.jsonl").write(rollouts)
    assert [t.env_index for t in select_rollouts(tmp_path / "r.jsonl", top_k=1)] == [1, 4, 8]


def test_rows_in_both_formats(rollouts):
    tokens = sft_rows(rollouts[:1])[0]
    assert tokens == {"input_ids": list(range(8)), "assistant_masks": [0, 0, 0, 1, 1, 0, 0, 1], "task_id": 7,
                      "group_id": 0, "round": 0, "reward": 0.0}
    messages = sft_rows(rollouts[:1], "messages")[0]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2] == {"role": "tool", "content": "4", "name": "python"}
    dataset = sft_dataset(rollouts, format="messages", top_k=1)
    assert dataset.column_names == ["messages", "task_id", "group_id", "round", "reward"] and len(dataset) == 3


def test_bad_input(rollouts):
    with pytest.raises(ValueError, match="No episode is left"):
        sft_dataset(rollouts, min_reward=2.0)
    with pytest.raises(ValueError, match="format must be 'tokens'"):
        sft_rows(rollouts, "chatml")
    with pytest.raises(ValueError, match="carries no conversation.*record_messages=True"):
        sft_rows([episode(0, 0, 1.0, 0, messages=False)], "messages")
    with pytest.raises(TypeError, match="needs trajectories"):
        sft_dataset(rollouts[0].steps)
