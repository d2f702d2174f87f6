"""LLMPythonTool-v0: Gymnasium contract, vector envs, tokens mode, turn rules, and tools in other envs."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import gym_llm  # noqa: F401  (registers the ids)
from gym_llm.core.spaces import unpack_tokens
from gym_llm.envs.gsm8k import LLMGSM8KEnv
from gym_llm.envs.python_tool import LLMPythonToolEnv, LLMPythonToolVectorEnv
from gym_llm.tools import PythonTool

TASKS = [{"question": f"What is {a} times {b}?", "answer": f"#### {a * b}"} for a, b in [(6, 7), (3, 9), (12, 12), (5, 5)]]


def code(snippet: str) -> str:
    return f"I will compute it.\n```python\n{snippet}\n```"


def calls(info) -> list[dict]:
    return json.loads(info["tool_calls"])


@pytest.fixture(scope="module")
def tool():
    tool = PythonTool(timeout_s=5.0, min_idle=1)
    tool.attach()
    yield tool
    tool.detach()


def test_check_env_passes_with_warnings_as_errors(gsm8k_test_file):
    env = gym.make("LLMPythonTool-v0", data_files=str(gsm8k_test_file), sandbox={"timeout_s": 5.0, "min_idle": 0})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_env(env.unwrapped, skip_render_check=False)
    finally:
        env.close()


def test_episode_runs_code_keeps_state_and_scores_the_final_answer(tool):
    env = LLMPythonToolEnv(tasks=TASKS, python_tool=tool)
    obs, info = env.reset(options={"task_id": 0})
    assert "```python code block" in obs and '"name": "python"' in obs  # system prompt + schema
    obs, reward, terminated, truncated, info = env.step(code("a, b = 6, 7\nprint(a * b)"))
    assert (reward, terminated, truncated) == (0.0, False, False)
    [call] = calls(info)
    assert call["code"] == "a, b = 6, 7\nprint(a * b)\n" and call["status"] == "ok" and not call["truncated"]
    assert call["duration_s"] > 0 and info["num_tool_calls"] == 1 and info["num_tool_calls_skipped"] == 0
    assert obs.endswith("<|im_start|>tool\n42\n<|im_end|>\n<|im_start|>assistant\n")
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "python", "arguments": {"code": "a + b"}}</tool_call>')
    assert env.unwrapped.episode.messages[-1].content == "13\n"
    obs, reward, terminated, truncated, info = env.step("So the product is 42.\n#### 42")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["correct"] and info["num_tool_calls"] == 0 and info["tool_calls"] == "[]"
    env.close()


def test_last_turn_is_scored_without_running_tools(tool):
    env = LLMPythonToolEnv(tasks=TASKS, python_tool=tool, max_turns=2)
    env.reset(options={"task_id": 1})
    _, _, terminated, _, _ = env.step(code("x = 27"))
    assert not terminated
    _, reward, terminated, truncated, info = env.step(code("print(x)") + "\n#### 27")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["num_tool_calls"] == 0 and info["num_tool_calls_skipped"] == 1
    env.close()


@pytest.mark.parametrize("reply, needle", [
    ('<tool_call>{"name": "python", "arguments": {"code": 1}</tool_call>', "not valid JSON"),
    ('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>', "unknown tool 'shell'"),
    ('<tool_call>{"name": "python", "arguments": {"cmd": "ls"}}</tool_call>', '{"code": "<python source>"}'),
    ("```python\nprint(1)\n", "not closed"),
])
def test_malformed_calls_become_error_tool_messages(tool, reply, needle):
    env = LLMPythonToolEnv(tasks=TASKS, python_tool=tool)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(reply)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert calls(info)[0]["status"] == "invalid"
    message = env.unwrapped.episode.messages[-1]
    assert message.role == "tool" and message.content.startswith("Error: ") and needle in message.content
    env.close()


def test_too_many_calls_in_one_reply_are_not_run(tool):
    env = LLMPythonToolEnv(tasks=TASKS, python_tool=tool, max_tool_calls_per_turn=2)
    env.reset(seed=0)
    _, _, _, _, info = env.step("\n".join(code(f"print({i})") for i in range(3)))
    assert [c["status"] for c in calls(info)] == ["ok", "ok", "invalid"]
    assert "at most 2 tool calls" in env.unwrapped.episode.messages[-1].content
    env.close()


def test_tokens_mode_appends_tool_results_as_new_tokens_only(qwen_tokenizer, tool):
    tok = qwen_tokenizer
    env = LLMPythonToolEnv(tasks=TASKS, python_tool=tool, mode="tokens", tokenizer=tok, max_seq_len=2048,
                           max_action_tokens=128)
    obs, info = env.reset(options={"task_id": 2})
    sequence = unpack_tokens(obs).tolist()
    reply = tok.encode(code("print(12 * 12)"), add_special_tokens=False) + [tok.eos_token_id]
    obs, reward, terminated, truncated, info = env.step(np.array(reply))
    new = unpack_tokens(obs).tolist()
    assert new[: len(sequence)] == sequence and new[len(sequence): len(sequence) + len(reply)] == reply
    assert np.flatnonzero(info["policy_mask"]).tolist() == list(range(len(sequence), len(sequence) + len(reply)))
    env_tokens = new[len(sequence) + len(reply):]
    chat = env.unwrapped.parts.extra["chat"]
    tool_message = env.unwrapped.episode.messages[-1]
    assert tool_message.content == "144\n"
    expected = chat.renderer.closing[len("<|im_end|>"):] + chat.renderer.render_continuation(
        [tool_message], system=env.unwrapped.episode.messages[0])
    assert env_tokens == tok.encode(expected, add_special_tokens=False)
    assert "144" in tok.decode(env_tokens) and tok.decode(env_tokens).endswith("<|im_start|>assistant\n")
    final = tok.encode("#### 144", add_special_tokens=False) + [tok.eos_token_id]
    obs, reward, terminated, _, _ = env.step(np.array(final))
    assert terminated and reward == 1.0
    assert unpack_tokens(obs).tolist()[: len(new)] == new
    env.close()


def _tool_summary(info, i):
    """Sub-env i's tool calls this step (from ``final_info`` when it ended), without durations."""
    if "final_info" in info and info["_final_info"][i]:
        info = info["final_info"]
    if "tool_calls" not in info or not info["_tool_calls"][i]:
        return None
    return [(c["code"], c["status"], c["truncated"]) for c in json.loads(info["tool_calls"][i])], info.get(
        "correct", [None] * (i + 1))[i]


def _steps(envs, replies_per_step):
    out = []
    for replies in replies_per_step:
        obs, reward, terminated, truncated, info = envs.step(replies)
        summary = [_tool_summary(info, i) for i in range(envs.num_envs)]
        out.append((obs, reward.tolist(), terminated.tolist(), truncated.tolist(), summary))
    return out


def test_native_vector_env_matches_sync_vector_env(tool):
    n = 4
    replies = [
        tuple(code(f"v = {i} * 11\nprint(v)") for i in range(n)),
        (code("v + 1"), "#### 0", code("1 / 0"), code("print('x' * 10)")),
        tuple(f"#### {i}" for i in range(n)),
    ]
    native = LLMPythonToolVectorEnv(n, tasks=TASKS, python_tool=tool)
    sync = SyncVectorEnv([lambda: LLMPythonToolEnv(tasks=TASKS, python_tool=tool) for _ in range(n)],
                         autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        obs_native, _ = native.reset(seed=7)
        obs_sync, _ = sync.reset(seed=7)
        assert obs_native == obs_sync
        assert _steps(native, replies) == _steps(sync, replies)
    finally:
        native.close()
        sync.close()
    assert tool._pool is not None  # the shared tool stays attached: the fixture still uses it


def test_native_vector_env_runs_the_tool_calls_of_all_sub_envs_in_parallel(tool):
    n, sleep_s = 4, 0.5
    envs = gym.make_vec("LLMPythonTool-v0", num_envs=n, vectorization_mode="vector_entry_point", tasks=TASKS,
                        python_tool=tool)
    try:
        assert envs.unwrapped._pool._max_workers == n  # the default: one worker thread per sub-env
        envs.reset(seed=0)
        envs.step(tuple(code("import time") for _ in range(n)))  # every sub-env leases its sandbox first
        timed = f"start = time.time()\ntime.sleep({sleep_s})\nprint(start, time.time())"
        _, _, _, _, info = envs.step(tuple(code(timed) for _ in range(n)))
        assert [json.loads(c)[0]["status"] for c in info["tool_calls"]] == ["ok"] * n
        # (start, end) as recorded inside each sandbox: all n calls were running at one instant
        intervals = [tuple(map(float, episode.messages[-1].content.split())) for episode in envs.unwrapped.episodes]
        assert all(end - start >= sleep_s for start, end in intervals)
        assert max(start for start, _ in intervals) < min(end for _, end in intervals), intervals
    finally:
        envs.close()


def test_make_vec_native_and_async(tool):
    native = gym.make_vec("LLMPythonTool-v0", num_envs=2, vectorization_mode="vector_entry_point", tasks=TASKS,
                          python_tool=tool)
    assert isinstance(native.unwrapped, LLMPythonToolVectorEnv) and native.unwrapped._pool._max_workers == 2
    native.close()
    for kwargs in ({"sandbox": {"timeout_s": 5.0, "min_idle": 0}}, {"python_tool": tool}):  # built in / pickled
        envs = gym.make_vec("LLMPythonTool-v0", num_envs=2, vectorization_mode="async", tasks=TASKS, **kwargs)
        try:
            envs.reset(seed=0)
            _, reward, terminated, _, info = envs.step((code("print(2 + 2)"), "#### 4"))
            assert info["num_tool_calls"].tolist() == [1, 0] and terminated.tolist() == [False, True]
            assert json.loads(info["tool_calls"][0])[0]["status"] == "ok"
        finally:
            envs.close()


def test_gsm8k_env_accepts_tools(gsm8k_test_file, tool):
    env = LLMGSM8KEnv(data_files=str(gsm8k_test_file), tools=[tool], max_turns=3)
    env.reset(options={"task_id": 0})
    answer = env.unwrapped.episode.task.answer
    _, reward, terminated, _, info = env.step(code(f"print({answer})"))
    assert not terminated and env.unwrapped.episode.messages[-1].content == f"{answer}\n"
    _, reward, terminated, _, info = env.step(f"#### {answer}")
    assert terminated and reward == 1.0
    env.close()


def test_tools_with_a_single_turn_are_rejected(gsm8k_test_file, tool):
    with pytest.raises(ValueError, match="max_turns >= 2"):
        LLMGSM8KEnv(data_files=str(gsm8k_test_file), tools=[tool])  # GSM8K's default max_turns is 1
    assert tool._pool is not None and tool._refs == 1  # nothing was attached for the failed env
