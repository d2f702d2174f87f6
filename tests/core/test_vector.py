"""Native vector envs: parity with SyncVectorEnv, GRPO groups, autoreset semantics, bad input."""

from __future__ import annotations

from collections import defaultdict

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import gym_llm  # noqa: F401  (registers the ids)
from gym_llm.core.messages import Message
from tests.envs.vector_checks import assert_same, without

PROMPTS = [{"prompt": f"Question {i}?", "follow_ups": ["More?"] * (i % 3)} for i in range(7)]


def _end_on_bye(messages, task):
    """A user simulator whose conversation length depends on the policy's reply."""
    return None if "bye" in messages[-1].content else "Go on."


def _reward(task, messages):
    return float(len(messages[-1].content)) + task.task_id / 100


def _actions(rng, n):
    return tuple("bye" if rng.random() < 0.4 else f"reply {rng.integers(100)}" for _ in range(n))


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
def test_native_equals_sync_vector_env(mode):
    kwargs = dict(prompts=PROMPTS, user_simulator=_end_on_bye, reward_fn=_reward, max_turns=3)
    native = gym.make_vec("LLMChat-v0", num_envs=4, vectorization_mode="vector_entry_point",
                          autoreset_mode=mode, **kwargs)
    sync = gym.make_vec("LLMChat-v0", num_envs=4, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": mode}, **kwargs)
    assert native.metadata["autoreset_mode"] == mode
    obs_n, info_n = native.reset(seed=7)
    obs_s, info_s = sync.reset(seed=7)
    assert obs_n == obs_s
    assert_same(without(info_n, "group_id"), info_s)  # group_id: only the native env has groups
    rng = np.random.default_rng(0)
    for _ in range(25):
        actions = _actions(rng, 4)
        out_n, out_s = native.step(actions), sync.step(actions)
        assert out_n[0] == out_s[0]
        for x, y in zip(out_n[1:4], out_s[1:4]):
            np.testing.assert_array_equal(x, y)
        assert_same(without(out_n[4], "group_id"), out_s[4])
    native.close(), sync.close()


def test_groups_share_tasks_per_round_whatever_the_finish_order():
    envs = gym.make_vec("LLMChat-v0", num_envs=8, group_size=4, prompts=PROMPTS,
                        user_simulator=_end_on_bye, max_turns=4)
    assert envs.unwrapped.num_groups == 2
    _, info = envs.reset(seed=3)
    seen: dict[tuple[int, int], set[int]] = defaultdict(set)
    members: dict[tuple[int, int], set[int]] = defaultdict(set)

    def record(info, where):
        for i in np.flatnonzero(info["_task_id"]):
            key = (int(info["group_id"][i]), int(info["round"][i]))
            seen[key].add(int(info["task_id"][i]))
            members[key].add(where[i] if where is not None else i)

    record(info, None)
    rng = np.random.default_rng(1)
    for _ in range(40):
        _, _, term, trunc, info = envs.step(_actions(rng, 8))
        record(info, None)
        if "final_info" in info:
            record(info["final_info"], None)
    assert all(len(tasks) == 1 for tasks in seen.values()), seen
    # members did finish in different orders: some (group, round) keys were reached at different steps
    assert max(r for _, r in seen) >= 5
    group_tasks = {g: [next(iter(seen[(g, r)])) for r in range(5)] for g in (0, 1)}
    assert group_tasks[0] != group_tasks[1]
    # group g's stream is the stream of a scalar env seeded with the group leader's seed
    scalar = gym.make("LLMChat-v0", prompts=PROMPTS).unwrapped
    expected = [scalar.reset(seed=3 + 4)[1]["task_id"]] + [scalar.reset()[1]["task_id"] for _ in range(4)]
    assert group_tasks[1] == expected


@pytest.mark.parametrize("order", ["shuffle", "sequential"])
def test_partition_gives_the_groups_of_a_round_distinct_tasks_and_covers_an_epoch(order):
    """task_assignment="partition": 7 tasks, 3 groups of 2 whose members finish in different orders."""
    envs = gym.make_vec("LLMChat-v0", num_envs=6, group_size=2, prompts=PROMPTS, user_simulator=_end_on_bye,
                        max_turns=4, task_order=order, task_assignment="partition")
    _, info = envs.reset(seed=5)
    tasks: dict[tuple[int, int], set[int]] = defaultdict(set)

    def record(info):
        for i in np.flatnonzero(info["_task_id"]):
            tasks[(int(info["group_id"][i]), int(info["round"][i]))].add(int(info["task_id"][i]))

    record(info)
    rng = np.random.default_rng(2)
    for _ in range(60):
        _, _, _, _, info = envs.step(_actions(rng, 6))
        record(info)
        if "final_info" in info:
            record(info["final_info"])
    assert all(len(t) == 1 for t in tasks.values()), tasks  # members of a group share the task
    rounds = min(max(r for g2, r in tasks if g2 == g) for g in range(3))  # rounds every group completed
    assert rounds >= 4
    # position r * num_groups + g of one stream: an epoch of 7 positions visits every task exactly once
    by_position = {r * 3 + g: next(iter(t)) for (g, r), t in tasks.items()}
    for epoch_start in range(0, 7 * ((3 * rounds) // 7), 7):
        assert sorted(by_position[p] for p in range(epoch_start, epoch_start + 7)) == list(range(7))
    for r in range(rounds):  # the groups of a round hold distinct tasks
        assert len({by_position[r * 3 + g] for g in range(3)}) == 3
    envs.close()


def test_task_assignment_is_checked():
    with pytest.raises(ValueError, match="task_assignment must be 'per_group' or 'partition'"):
        gym.make_vec("LLMChat-v0", num_envs=2, task_assignment="random")


def test_same_step_keeps_terminal_reward_and_info(gsm8k_test_file):
    envs = gym.make_vec("LLMGSM8K-v0", num_envs=4, group_size=2, data_files=gsm8k_test_file)
    obs, info = envs.reset(seed=0)
    answers = [envs.unwrapped.episodes[i].task.answer for i in range(4)]
    first_tasks = info["task_id"].copy()
    actions = tuple(f"The answer is {a}." if i % 2 == 0 else "#### -1" for i, a in enumerate(answers))
    obs, rewards, term, trunc, info = envs.step(actions)
    np.testing.assert_array_equal(rewards, [1.0, 0.0, 1.0, 0.0])
    assert term.all() and not trunc.any()
    assert info["_final_obs"].all() and info["_final_info"].all()
    final = info["final_info"]
    np.testing.assert_array_equal(final["correct"], [True, False, True, False])
    np.testing.assert_array_equal(final["task_id"], first_tasks)
    assert list(final["reference_answer"]) == answers
    assert all(info["final_obs"][i].endswith(actions[i]) for i in range(4))
    # the sub-envs already moved on to round 1 (same task within each group)
    np.testing.assert_array_equal(info["round"], [1, 1, 1, 1])
    assert info["task_id"][0] == info["task_id"][1] and info["task_id"][2] == info["task_id"][3]
    assert all(isinstance(o, str) and o.endswith("<|im_start|>assistant\n") for o in obs)


def test_rejected_action_changes_nothing():
    envs = gym.make_vec("LLMChat-v0", num_envs=3, prompts=PROMPTS, max_turns=3)
    obs, _ = envs.reset(seed=0)
    before = [list(e.messages) for e in envs.unwrapped.episodes]
    with pytest.raises(TypeError, match=r"sub-env 2 \(task \d+, group \d+\): Expected the action as a str"):
        envs.step(("fine", "also fine", 42))
    with pytest.raises(ValueError, match="expects 3 actions"):
        envs.step(("a", "b"))
    assert [list(e.messages) for e in envs.unwrapped.episodes] == before
    obs2, *_ = envs.step(("fine", "also fine", "ok"))  # and the env keeps working
    assert len(obs2) == 3


def test_step_before_reset_and_bad_reset_options():
    envs = gym.make_vec("LLMChat-v0", num_envs=2)
    with pytest.raises(gym.error.ResetNeeded, match="reset"):
        envs.step(("a", "b"))
    with pytest.raises(ValueError, match="Unknown reset option"):
        envs.reset(options={"tsk": 1})
    with pytest.raises(ValueError, match=r"task_id.*\[0, 24\)"):
        envs.reset(options={"task_id": 99})
    obs, info = envs.reset(seed=0, options={"task_id": 5})
    assert (info["task_id"] == 5).all()


def test_disabled_autoreset_and_partial_reset():
    envs = gym.make_vec("LLMChat-v0", num_envs=2, autoreset_mode="Disabled", prompts=["a", "b"], max_turns=1)
    envs.reset(seed=0)
    _, _, term, _, info = envs.step(("x", "y"))
    assert term.all() and "final_obs" not in info
    with pytest.raises(gym.error.ResetNeeded, match="reset_mask"):
        envs.step(("x", "y"))
    obs, info = envs.reset(options={"reset_mask": np.array([True, False])})
    assert info["_round"].tolist() == [True, False] and info["round"][0] == 1
    with pytest.raises(ValueError, match="bool numpy array"):
        envs.reset(options={"reset_mask": [True, False]})


def test_tokens_mode_batches_arrays(tiny_tok):
    envs = gym.make_vec("LLMChat-v0", num_envs=3, mode="tokens", tokenizer=tiny_tok, max_seq_len=128,
                        max_action_tokens=16, max_turns=2, prompts=[{"prompt": "hi", "follow_ups": ["more"]}])
    obs, info = envs.reset(seed=0)
    assert obs["input_ids"].shape == (3, 128) and obs["attention_mask"].shape == (3, 128)
    assert info["policy_mask"].shape == (3, 128)
    actions = {"input_ids": np.full((3, 16), 7), "attention_mask": np.zeros((3, 16), dtype=np.int8)}
    actions["attention_mask"][:, :3] = 1
    obs2, *_ , info2 = envs.step(actions)
    n_before = obs["attention_mask"].sum(1)
    for i in range(3):
        assert obs2["input_ids"][i, n_before[i]: n_before[i] + 3].tolist() == [7, 7, 7]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_gymnasium_vectorizers_work(mode, gsm8k_test_file):
    envs = gym.make_vec("LLMGSM8K-v0", num_envs=2, vectorization_mode=mode, data_files=str(gsm8k_test_file))
    obs, info = envs.reset(seed=1)
    assert len(obs) == 2 and all(isinstance(o, str) for o in obs)
    obs, rewards, term, trunc, info = envs.step(("#### 1", "#### 2"))
    assert term.all() and rewards.shape == (2,)
    envs.close()


def test_group_size_must_divide_num_envs():
    with pytest.raises(ValueError, match="divides num_envs=6"):
        gym.make_vec("LLMChat-v0", num_envs=6, group_size=4)


def test_a_half_built_vector_env_closes_quietly():
    """A constructor that raised leaves an env that Gymnasium's ``__del__`` closes (gymnasium 1.2 printed
    "Exception ignored ... no attribute 'episodes'" for every bad argument)."""
    from gym_llm.envs.chat import LLMChatVectorEnv

    LLMChatVectorEnv.__new__(LLMChatVectorEnv).close_extras()


def test_render_ansi():
    env = gym.make("LLMChat-v0", render_mode="ansi", prompts=["hello"])
    env.reset(seed=0)
    env.step("hi!")
    text = env.render()
    assert "hello" in text and "hi!" in text
    envs = gym.make_vec("LLMChat-v0", num_envs=2, render_mode="ansi", prompts=["hello"])
    envs.reset(seed=0)
    assert all("hello" in t for t in envs.render())


def test_messages_are_typed():
    env = gym.make("LLMChat-v0", prompts=[{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}],
                   system_prompt="ignored when the task has its own")
    env.reset(seed=0)
    assert env.unwrapped.episode.messages == [Message("system", "S"), Message("user", "U")]


import warnings  # noqa: E402

from hypothesis import assume, given, settings, strategies as st  # noqa: E402

from gym_llm.core.vector import batch_infos  # noqa: E402

_leaf = st.one_of(st.integers(-5, 5), st.floats(allow_nan=False), st.booleans(), st.text(max_size=3),
                  st.just(np.arange(3, dtype=np.int8)), st.just(np.float32(1.5)), st.lists(st.integers(), max_size=2))
_info = st.dictionaries(st.sampled_from(["a", "b", "c", "final_obs"]), _leaf, max_size=3)
_nested = st.dictionaries(st.sampled_from(["a", "d", "final_info"]), st.one_of(_leaf, _info), max_size=3)


@settings(max_examples=300, deadline=None)
@given(infos=st.lists(st.one_of(st.none(), _nested), min_size=1, max_size=5))
def test_batch_infos_equals_gymnasium_add_info(infos):
    """Same keys, masks, dtypes and values as VectorEnv._add_info called sub-env by sub-env."""
    # a key keeps one kind of value across sub-envs, as in real envs
    kinds: dict[str, type] = {}
    clean = []
    for info in infos:
        if info is None:
            clean.append(None)
            continue
        kept = {}
        for k, v in info.items():
            kind = dict if isinstance(v, dict) else type(v)
            if kinds.setdefault(k, kind) is kind:
                kept[k] = v
        clean.append(kept)
    n = len(clean)
    ref_env = gym.vector.VectorEnv()
    ref_env.num_envs = n
    expected: dict = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, info in enumerate(clean):
                if info is not None:
                    expected = ref_env._add_info(expected, info, i)
    except (TypeError, ValueError, OverflowError):
        assume(False)  # Gymnasium itself cannot batch these mixed kinds: nothing to agree with
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = batch_infos(clean, n)
    _assert_deep_equal(result, expected)


def _assert_deep_equal(a, b):
    assert set(a) == set(b)
    for key in a:
        if isinstance(b[key], dict):
            _assert_deep_equal(a[key], b[key])
        else:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            for x, y in zip(a[key], b[key]):
                assert np.array_equal(x, y) if isinstance(x, np.ndarray) else (x == y or (x != x and y != y))


def test_task_ids_option_runs_one_task_per_sub_env():
    envs = gym.make_vec("LLMChat-v0", num_envs=4, group_size=2, prompts=PROMPTS, max_turns=1)
    obs, info = envs.reset(seed=3, options={"task_ids": [5, 5, 2, None]})
    assert info["task_id"][:3].tolist() == [5, 5, 2]
    assert "Question 5?" in obs[0] and "Question 2?" in obs[2]
    # the None entry draws from the stream; sub-env 3 follows its group leader's stream afterwards
    streamed = gym.make_vec("LLMChat-v0", num_envs=4, group_size=2, prompts=PROMPTS, max_turns=1)
    _, info_streamed = streamed.reset(seed=3)
    assert info["task_id"][3] == info_streamed["task_id"][3]
    _, _, term, trunc, info = envs.step(("a", "b", "c", "d"))  # the next episodes come from the streams again
    assert (term | trunc).all() and info["final_info"]["task_id"].tolist() == [5, 5, 2, info_streamed["task_id"][3]]
    # with a reset mask, only the masked entries are used
    _, info = envs.reset(options={"task_ids": [0, 1, 2, 3], "reset_mask": np.array([False, True, False, False])})
    assert info["_task_id"].tolist() == [False, True, False, False] and info["task_id"][1] == 1


@pytest.mark.parametrize("options, error, match", [
    ({"task_ids": [1, 2]}, ValueError, r"sequence of 4 task indices.*length 2"),
    ({"task_ids": "abcd"}, ValueError, "sequence of 4 task indices"),
    ({"task_ids": [0, 1, 2, 99]}, ValueError, r"task_ids'\]\[3\] must be in \[0, 7\)"),
    ({"task_ids": [0, 1.5, 2, 3]}, TypeError, r"task_ids'\]\[1\] must be an int or None"),
    ({"task_ids": [0, 1, 2, 3], "task_id": 1}, ValueError, "not both"),
])
def test_task_ids_option_bad_input(options, error, match):
    envs = gym.make_vec("LLMChat-v0", num_envs=4, prompts=PROMPTS)
    with pytest.raises(error, match=match):
        envs.reset(seed=0, options=options)


def test_scalar_env_rejects_task_ids():
    env = gym.make("LLMChat-v0", prompts=PROMPTS)
    with pytest.raises(ValueError, match="vector envs also take 'task_ids'"):
        env.reset(options={"task_ids": [1]})
