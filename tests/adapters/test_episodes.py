"""EpisodeBuilder and GroupBuffer edge cases the env-driven tests do not reach."""

from __future__ import annotations

import numpy as np
import pytest

from gym_llm_adapters.episodes import EpisodeBuilder, GroupBuffer, info_at, scalar_info
from gym_llm_adapters.types import Completion


def completion(prompt, ids, version=0):
    ids = np.asarray(ids, dtype=np.int64)
    return Completion(np.asarray(prompt, dtype=np.int64), ids, -np.arange(1, len(ids) + 1, dtype=np.float32),
                      "t", "stop", version)


def test_sequence_grows_by_sampled_and_env_tokens():
    b = EpisodeBuilder(0, 7, 1, 2, np.array([1, 2, 3]))
    b.add_step(completion([1, 2, 3], [4, 5]), reward=1.0, terminated=False, truncated=False, info={"turn": 1})
    b.observe(np.array([1, 2, 3, 4, 5, 9, 9]))
    b.add_step(completion([1, 2, 3, 4, 5, 9, 9], [6], version=1), reward=2.0, terminated=True, truncated=False,
               info={"turn": 2, "policy_mask": np.ones(3), "note": np.float32(0.5)})
    t = b.finish(np.array([1, 2, 3, 4, 5, 9, 9, 6]), np.array([0, 0, 0, 1, 1, 0, 0, 1, 0, 0]))
    assert t.token_ids.tolist() == [1, 2, 3, 4, 5, 9, 9, 6] and t.policy_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    assert t.logprobs.tolist() == [0, 0, 0, -1, -2, 0, 0, -1] and t.rewards == [1.0, 2.0] and t.versions == [0, 1]
    assert t.prompt_length == 3 and t.token_exact and t.terminated and (t.task_id, t.group_id, t.round) == (7, 1, 2)
    assert t.steps[1].info == {"turn": 2, "note": 0.5}  # arrays dropped, numpy scalars made plain


def test_env_cutting_the_last_action_is_followed():
    b = EpisodeBuilder(0, 0, 0, 0, np.array([1, 2]))
    b.add_step(completion([1, 2], [3, 4, 5]), reward=0.0, terminated=False, truncated=True, info={})
    t = b.finish(np.array([1, 2, 3]), None)  # max_seq_len kept one sampled token
    assert t.token_ids.tolist() == [1, 2, 3] and t.policy_mask.tolist() == [0, 0, 1] and t.logprobs.tolist() == [0, 0, -1]


def test_changed_tokens_and_disagreeing_masks_raise():
    b = EpisodeBuilder(3, 0, 0, 0, np.array([1, 2]))
    b.add_step(completion([1, 2], [3]), reward=0.0, terminated=True, truncated=False, info={})
    with pytest.raises(RuntimeError, match="changed tokens the policy sampled"):
        b.finish(np.array([1, 2, 8]), None)
    with pytest.raises(RuntimeError, match="policy_mask disagrees"):
        b.finish(np.array([1, 2, 3]), np.array([0, 1, 1]))


def test_retokenised_history_restarts_the_sequence():
    b = EpisodeBuilder(0, 0, 0, 0, np.array([1, 2]))
    b.add_step(completion([1, 2], [3, 4]), reward=0.0, terminated=False, truncated=False, info={})
    b.observe(np.array([1, 2, 34, 9]))  # "3 4" re-tokenised as one id
    b.add_step(completion([1, 2, 34, 9], [5]), reward=1.0, terminated=True, truncated=False, info={})
    t = b.finish(None, None)
    assert not t.token_exact and t.token_ids.tolist() == [1, 2, 34, 9, 5] and t.policy_mask.tolist() == [0, 0, 0, 0, 1]
    assert t.prompt_length == 0 and len(t.steps) == 2


def test_group_buffer_releases_whole_groups_in_completion_order():
    buffer = GroupBuffer(2)
    b = EpisodeBuilder(0, 0, 0, 0, np.array([1]))
    b.add_step(completion([1], [2]), reward=0.0, terminated=True, truncated=False, info={})
    base = b.finish(None, None)

    def member(group, round_, env_index):
        t = base.__class__(**{f: getattr(base, f) for f in base.__dataclass_fields__})
        t.group_id, t.round, t.env_index = group, round_, env_index
        return t

    buffer.add(member(1, 0, 3))
    buffer.add(member(0, 0, 1))
    buffer.add(member(1, 0, 2))
    assert buffer.num_ready == 2 and buffer.num_open == 1
    assert [t.env_index for t in buffer.pop(2)] == [2, 3]
    buffer.add(member(0, 0, 0))
    assert [(t.group_id, t.env_index) for t in buffer.pop(2)] == [(0, 0), (0, 1)]


def test_info_at_follows_gymnasium_masks():
    infos = {"a": np.array([1, 2]), "_a": np.array([True, False]), "final_info": {"r": np.array([0.0, 5.0]),
             "_r": np.array([False, True])}, "_final_info": np.array([False, True])}
    assert info_at(infos, 0) == {"a": 1}
    assert info_at(infos, 1) == {"final_info": {"r": 5.0}}
    assert scalar_info({"x": np.int64(3), "y": [1], "final_obs": "o", "s": "t"}) == {"x": 3, "s": "t"}
