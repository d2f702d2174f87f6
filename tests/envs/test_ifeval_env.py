"""LLMIFEval-v0: Gymnasium contract, reward options, sources, vector envs, parallel scoring."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gym_llm  # noqa: F401  (registers the ids)
from gym_llm.envs.ifeval import LLMIFEvalEnv, LLMIFEvalVectorEnv, load_ifeval_tasks
from gym_llm.rewards.ifeval import evaluate

from .vector_checks import assert_same, without

# A reply that follows some instructions of many rows and breaks others.
REPLY = "<<A Title>>\n\nHere is my answer, in two parts.\n\n* first\n* second\n\nP.S. That is all."


@pytest.fixture(scope="module")
def rows(ifeval_file):
    return [json.loads(line) for line in ifeval_file.read_text().splitlines() if line.strip()]


def _row_index(rows, n_instructions: int) -> int:
    return next(i for i, r in enumerate(rows) if len(r["instruction_id_list"]) == n_instructions
                and 0 < sum(evaluate(REPLY, r["instruction_id_list"], r["kwargs"]).strict) < n_instructions)


@pytest.mark.parametrize("mode", ["text", "tokens"])
def test_check_env_passes_with_warnings_as_errors(ifeval_file, tiny_tok, mode):
    kwargs = {"mode": "tokens", "tokenizer": tiny_tok, "max_seq_len": 2048, "max_action_tokens": 256} if mode == "tokens" else {}
    # (check_env resets on unseeded, random tasks: max_seq_len must hold the longest IFEval prompt, 1,065 tiny-tokenizer
    # tokens plus the template, or the test fails on the few runs that draw it)
    env = gym.make("LLMIFEval-v0", data_files=str(ifeval_file), **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


@pytest.mark.parametrize(("reward_mode", "loose"), [("fraction", False), ("all", False), ("fraction", True), ("all", True)])
def test_reward_options_and_info(ifeval_file, rows, reward_mode, loose):
    index = _row_index(rows, 3)
    row = rows[index]
    reply = "Sure:\n" + REPLY  # a chatty first line: loose can differ from strict
    expected = evaluate(reply, row["instruction_id_list"], row["kwargs"], prompt=row["prompt"])
    env = LLMIFEvalEnv(data_files=str(ifeval_file), reward_mode=reward_mode, loose=loose)
    obs, info = env.reset(seed=0, options={"task_id": index})
    assert row["prompt"] in obs and info["task_id"] == index
    _, reward, terminated, truncated, info = env.step(reply)
    followed = expected.loose if loose else expected.strict
    assert reward == (float(all(followed)) if reward_mode == "all" else sum(followed) / len(followed))
    assert (terminated, truncated) == (True, False)
    assert info["instruction_results"] == expected.to_json()
    assert (info["prompt_strict"], info["prompt_loose"]) == (expected.strict_all, expected.loose_all)
    assert info["num_instructions"] == 3 and info["num_strict_followed"] == sum(expected.strict)
    assert info["key"] == row["key"]
    with pytest.raises(gym.error.ResetNeeded):
        env.step(reply)


def test_tokens_mode_scores_the_decoded_reply(ifeval_file, rows, tiny_tok):
    index = _row_index(rows, 2)
    reply = "Sure:\n" + REPLY
    text_env = LLMIFEvalEnv(data_files=str(ifeval_file))
    token_env = LLMIFEvalEnv(data_files=str(ifeval_file), mode="tokens", tokenizer=tiny_tok, max_seq_len=1024,
                             max_action_tokens=512)
    text_env.reset(seed=0, options={"task_id": index})
    obs, _ = token_env.reset(seed=0, options={"task_id": index})
    assert obs["attention_mask"].sum() > 0
    ids = tiny_tok.encode(reply, add_special_tokens=False) + [tiny_tok.eos_token_id]
    out_text, out_tokens = text_env.step(reply), token_env.step(np.array(ids))
    assert out_tokens[1] == out_text[1] and out_tokens[4]["instruction_results"] == out_text[4]["instruction_results"]
    assert out_tokens[4]["policy_mask"].sum() == len(ids)


def test_strip_thinking_scores_only_the_answer(ifeval_file, rows):
    index = next(i for i, r in enumerate(rows) if r["instruction_id_list"] == ["punctuation:no_comma"])
    env = LLMIFEvalEnv(data_files=str(ifeval_file), strip_thinking=True)
    env.reset(seed=0, options={"task_id": index})
    assert env.step("<think>Hmm, commas, commas.</think>\nNo commas in this answer.")[1] == 1.0
    plain = LLMIFEvalEnv(data_files=str(ifeval_file))
    plain.reset(seed=0, options={"task_id": index})
    assert plain.step("<think>Hmm, commas, commas.</think>\nNo commas in this answer.")[1] == 0.0


def test_sources_rows_dataset_and_errors(ifeval_file, rows, tmp_path):
    import datasets

    from_rows = load_ifeval_tasks(tasks=iter(rows[:5]))
    from_dataset = load_ifeval_tasks(tasks=datasets.Dataset.from_list(rows[:5]))
    from_file = load_ifeval_tasks(data_files=str(ifeval_file))
    assert len(from_file) == 541 and [t.data for t in from_rows] == [t.data for t in from_file[:5]]
    # datasets fills absent kwargs keys with None (like the hub's google/IFEval); they are dropped.
    assert [t.data for t in from_dataset] == [t.data for t in from_rows]
    with pytest.raises(ValueError, match="row 0 needs"):
        load_ifeval_tasks(tasks=[{"prompt": "x"}])
    with pytest.raises(ValueError, match=r"row 1 \(key 7\).*Unknown IFEval instruction id"):
        load_ifeval_tasks(tasks=[rows[0], {**rows[0], "key": 7, "instruction_id_list": ["nope:nope"], "kwargs": [{}]}])
    with pytest.raises(ValueError, match="missing"):
        load_ifeval_tasks(tasks=[{**rows[0], "kwargs": [{}, {}, {}]}])
    with pytest.raises(RuntimeError, match="data_files="):
        load_ifeval_tasks(source="hub", dataset_name=str(tmp_path / "no-such-dataset"))
    with pytest.raises(ValueError, match="reward_mode"):
        LLMIFEvalEnv(tasks=rows[:2], reward_mode="mean")


def test_bad_action_raises_and_changes_nothing(ifeval_file):
    env = LLMIFEvalEnv(data_files=str(ifeval_file))
    obs, _ = env.reset(seed=3)
    for bad in (123, b"bytes", None, "x" * 20_000):
        with pytest.raises((TypeError, ValueError)):
            env.step(bad)
    assert env.episode.turn == 0 and env.episode.messages[-1].role == "user"
    _, _, terminated, _, _ = env.step("fine")
    assert terminated


def _scalar(path):
    return lambda: LLMIFEvalEnv(data_files=path)


def test_native_vector_equals_sync_vector_env(ifeval_file):
    path, n = str(ifeval_file), 3
    native = gym.make_vec("LLMIFEval-v0", num_envs=n, vectorization_mode="vector_entry_point", data_files=path,
                          scoring_workers=0)
    sync = SyncVectorEnv([_scalar(path)] * n, autoreset_mode=AutoresetMode.SAME_STEP)
    assert native.metadata["autoreset_mode"] == sync.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs_a, info_a = native.reset(seed=11)
    obs_b, info_b = sync.reset(seed=11)
    assert_same(obs_a, obs_b)
    assert_same(without(info_a, "group_id"), info_b)
    rng = np.random.default_rng(0)
    for _ in range(4):
        actions = tuple(REPLY if rng.random() < 0.5 else "no, thanks" for _ in range(n))
        out_a, out_b = native.step(actions), sync.step(actions)
        for a, b in zip(out_a[:4], out_b[:4]):
            assert_same(a, b)
        assert_same(without(out_a[4], "group_id"), out_b[4])
        assert out_a[4]["_final_info"].all()  # terminal info kept, autoreset in the same step
    native.close()
    sync.close()


def test_groups_share_tasks(ifeval_file):
    envs = LLMIFEvalVectorEnv(6, group_size=3, data_files=str(ifeval_file), scoring_workers=0)
    _, info = envs.reset(seed=5)
    for _ in range(3):
        ids = info["task_id"]
        assert len(set(ids[:3])) == 1 and len(set(ids[3:])) == 1
        _, _, _, _, info = envs.step(("a",) * 6)
    envs.close()


@pytest.mark.slow
def test_process_pool_scores_equal_inline_scores(ifeval_file):
    path = str(ifeval_file)
    replies = [REPLY, "Sure:\n" + REPLY.upper(), "no commas here", '"quoted answer"']
    results = []
    for workers in (0, 2):
        envs = LLMIFEvalVectorEnv(4, data_files=path, scoring_workers=workers)
        assert (envs._pool is not None) == (workers > 0)  # respond threads only when processes score
        envs.reset(seed=1)
        steps = [envs.step(tuple(replies)) for _ in range(3)]
        results.append([(s[1], s[4]["final_info"]["instruction_results"]) for s in steps])
        envs.close()
    for (r0, j0), (r2, j2) in zip(*results):
        np.testing.assert_array_equal(r0, r2)
        assert j0.tolist() == j2.tolist()


def test_async_vector_env(ifeval_file):
    # Text observations cannot go through Gymnasium's shared memory (it stores Text by charset index). Each worker
    # scores in its own process (scoring_workers=0): a scoring pool per worker would be two more interpreters
    # importing the checkers (~5 CPU-s); the pool has its own tests.
    envs = gym.make_vec("LLMIFEval-v0", num_envs=2, vectorization_mode="async", data_files=str(ifeval_file),
                        scoring_workers=0, vector_kwargs={"shared_memory": False, "autoreset_mode": AutoresetMode.SAME_STEP})
    _, info = envs.reset(seed=0)
    _, reward, terminated, _, info = envs.step(("No commas.", "One, two."))
    assert terminated.all() and reward.shape == (2,) and "instruction_results" in info["final_info"]
    envs.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replies=st.lists(st.text(max_size=300), min_size=2, max_size=2), seed=st.integers(0, 2**31 - 1))
def test_random_replies_property(ifeval_file, replies, seed):
    envs = _ENVS.setdefault("vec", LLMIFEvalVectorEnv(2, data_files=str(ifeval_file), scoring_workers=0))
    envs.reset(seed=seed)
    _, reward, terminated, truncated, info = envs.step(tuple(replies))
    final = info["final_info"]
    assert terminated.all() and not truncated.any()
    assert ((0.0 <= reward) & (reward <= 1.0)).all()
    np.testing.assert_allclose(reward, final["num_strict_followed"] / final["num_instructions"])
    for k in range(2):
        results = json.loads(final["instruction_results"][k])
        assert sum(r["strict"] for r in results) == final["num_strict_followed"][k]
        assert all(r["loose"] or not r["strict"] for r in results)  # strict implies loose


_ENVS: dict = {}


def test_scoring_runs_under_a_deadline_and_fails_closed(monkeypatch, ifeval_file):
    """A reply whose scoring outlasts the deadline gets reward 0 with the reason; the worker is killed and the next
    reply is scored normally."""
    from gym_llm.rewards import ifeval_pool

    monkeypatch.setattr(ifeval_pool, "IFEVAL_TIMEOUT_S", 1e-6)  # nothing can be scored that fast
    env = LLMIFEvalEnv(data_files=str(ifeval_file))
    try:
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step("Some reply.")
        assert terminated and reward == 0.0 and "DeadlineExceeded" in info["reward_error"], info
        env.reset(seed=1)  # the env goes on
        _, reward, terminated, _, info = env.step("Another reply.")
        assert terminated and reward == 0.0 and "DeadlineExceeded" in info["reward_error"], info
    finally:
        env.close()
    with ifeval_pool.IFEvalScorer(timeout_s=30.0) as scorer:
        assert scorer.evaluate("no commas here", ["punctuation:no_comma"], [{}]).strict == (True,)
