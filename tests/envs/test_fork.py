"""Forking episodes (``LLMEnv.fork``, ``LLMVectorEnv.fork``/``branch``): a fork is checked against first principles —
a fresh env, seeded alike and fed the same actions (the shared past, then the sibling's own), must give exactly the
sibling's observations, rewards and episode ends; and the parent must go on as if it had never been forked.
The Python REPL's forked state and the siblings' isolation are in tests/tools/test_python_fork.py."""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import gym_llm
from gym_llm.core.episode import ForkError
from tests.envs.cases import env_cases, make_kwargs

CASES = [c for c in env_cases() if c[0] != "LLMBrowser-v0"]  # the browser env: tests/tools/test_browser_tool.py
TEXT_ACTIONS = ["Let me think: 12 + 30 = 42.", "So the answer is\n#### 42", "<answer>42</answer>", "Done."]


def _actions(env: gym.Env, seed: int, n: int) -> list:
    if isinstance(env.action_space, gym_llm.UnicodeText):
        return [TEXT_ACTIONS[(seed + i) % len(TEXT_ACTIONS)] for i in range(n)]
    env.action_space.seed(seed)
    return [env.action_space.sample() for _ in range(n)]


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    return bool(np.array_equal(a, b)) if isinstance(a, np.ndarray) else a == b


def _run(env: gym.Env, actions: list) -> list[tuple]:
    """(observation, reward, terminated, truncated) per step, stopping where the episode ends."""
    out = []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        out.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            break
    return out


def _fresh(env_id: str, kwargs: dict, seed: int, past: list, actions: list) -> list[tuple]:
    """What a fresh env seeded alike gives for ``actions`` after ``past``."""
    env = gym.make(env_id, **kwargs).unwrapped
    env.reset(seed=seed)
    try:
        _run(env, past)
        return _run(env, actions)
    finally:
        env.close()


def _assert_same_runs(got: list[tuple], want: list[tuple], who: str) -> None:
    assert len(got) == len(want), f"{who}: {len(got)} steps, a fresh env took {len(want)}"
    for step, (g, w) in enumerate(zip(got, want)):
        assert _same(g[0], w[0]), f"{who}: step {step}'s observation differs from a fresh env's"
        assert g[1:] == w[1:], f"{who}: step {step}: (reward, terminated, truncated) {g[1:]} != fresh {w[1:]}"


@pytest.mark.parametrize("env_id,case", CASES, ids=[f"{i}-{n}" for i, n in CASES])
def test_a_fork_continues_exactly_as_a_fresh_env_fed_the_same_actions(env_id, case):
    kwargs = make_kwargs(env_id, case)
    seed = 11
    env = gym.make(env_id, **kwargs).unwrapped
    env.reset(seed=seed)
    past = _actions(env, seed, 1)
    if _run(env, past)[-1][2:] != (False, False):  # a one-step episode: branch right after reset instead
        env.reset(seed=seed)
        past = []
    siblings = env.fork(2)
    own = [_actions(env, seed + 1 + k, 3) for k in range(3)]  # the parent's and each sibling's continuation
    parent_run = _run(env, own[0])
    env.close()  # the siblings go on without their parent
    runs = [_run(sibling, actions) for sibling, actions in zip(siblings, own[1:])]
    for sibling in siblings:
        sibling.close()
    _assert_same_runs(parent_run, _fresh(env_id, kwargs, seed, past, own[0]), "the parent")
    for k, run in enumerate(runs):
        _assert_same_runs(run, _fresh(env_id, kwargs, seed, past, own[k + 1]), f"sibling {k}")


def test_siblings_keep_the_rng_and_task_stream_of_their_parent():
    env = gym.make("LLMChat-v0").unwrapped
    env.reset(seed=5)
    (sibling,) = env.fork()
    env.step("hi")
    sibling.step("hello")
    tasks = [(env.reset()[1]["task_id"], sibling.reset()[1]["task_id"]) for _ in range(4)]
    assert all(a == b for a, b in tasks), tasks  # the next episodes follow the same seeded stream
    env.close()
    sibling.close()


def test_fork_refuses_bad_calls_and_changes_nothing():
    env = gym.make("LLMGSM8K-v0", **make_kwargs("LLMGSM8K-v0", "text")).unwrapped
    with pytest.raises(ForkError, match="reset"):
        env.fork()
    env.reset(seed=0)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="int >= 1"):
            env.fork(bad)
    env.step("#### 3")  # single-turn: the episode has ended
    with pytest.raises(ForkError, match="episode in progress"):
        env.fork()
    env.close()


def test_the_shared_parts_close_with_the_last_of_the_family():
    from gym_llm.tools import PythonTool

    tool = PythonTool(min_idle=0)
    env = gym.make("LLMChat-v0", tools=[tool], max_turns=4).unwrapped
    env.reset(seed=0)
    a, b = env.fork(2)
    env.close()
    a.close()
    assert tool._pool is not None  # b still uses the tool
    b.step("```python\nprint(6 * 7)\n```")
    assert b.episode.messages[-1].content == "42\n"
    b.close()
    b.close()  # idempotent
    assert tool._pool is None


def _stack(actions: list, text: bool):
    if text:
        return tuple(actions)
    return {k: np.stack([a[k] for a in actions]) for k in actions[0]} if isinstance(actions[0], dict) \
        else np.stack(actions)


def _row(obs, i: int, text: bool):
    return obs[i] if text else {k: v[i] for k, v in obs.items()}


@pytest.mark.parametrize("mode", ["text", "tokens"])
def test_vector_branch_and_fork_continue_a_sub_env(mode):
    kwargs = make_kwargs("LLMChat-v0", mode)
    text = mode == "text"
    envs = gym.make_vec("LLMChat-v0", num_envs=4, vectorization_mode="vector_entry_point", **kwargs).unwrapped
    envs.reset(seed=3)
    single = gym.make("LLMChat-v0", **kwargs).unwrapped
    first = _actions(single, 0, 4)
    _, _, terminated, truncated, info = envs.step(_stack(first, text))
    going = np.flatnonzero(~(terminated | truncated))
    assert going.size, "every sub-env's conversation ended after one turn: pick another seed"
    src = int(going[0])
    task = int(info["task_id"][src])
    targets = [i for i in range(4) if i != src]
    obs = envs.branch(src, targets)
    assert all(_same(_row(obs, t, text), _row(obs, src, text)) for t in targets)
    (scalar,) = envs.fork(src)
    assert type(scalar).__name__ == "LLMChatEnv"
    nxt = _actions(single, 7, 4)
    got = envs.step(_stack(nxt, text))
    envs.close()  # the scalar fork keeps the parts open
    scalar_got = _run(scalar, [nxt[0]])[-1]
    scalar.close()
    single.close()
    # Sub-env src's episode went on in every row, each with its own action: each equals a fresh env fed that task's
    # shared first turn and then the row's own action.
    for row in range(4):
        fresh = gym.make("LLMChat-v0", **kwargs).unwrapped
        fresh.reset(options={"task_id": task})
        want = _run(fresh, [first[src], nxt[row]])[-1]
        fresh.close()
        ended = want[2] or want[3]  # the row then shows the next episode's start (autoreset); its end is in info
        shown = got[4]["final_obs"][row] if ended else _row(got[0], row, text)
        assert _same(shown, want[0]) and (got[1][row], got[2][row], got[3][row]) == want[1:], row
        if row == 0:
            assert _same(scalar_got[0], want[0]) and scalar_got[1:] == want[1:]


def test_vector_branch_refuses_bad_indices_and_changes_nothing():
    envs = gym.make_vec("LLMChat-v0", num_envs=3, vectorization_mode="vector_entry_point").unwrapped
    with pytest.raises(gym.error.ResetNeeded):
        envs.branch(0, [1])
    obs, _ = envs.reset(seed=0)
    for source, targets, error in [(0, [0], ValueError), (0, [1, 1], ValueError), (0, [3], ValueError),
                                   (-1, [1], ValueError), (0, 1, TypeError), (True, [1], ValueError)]:
        with pytest.raises(error):
            envs.branch(source, targets)
    assert envs.step(("x", "y", "z"))[0] != obs  # still steps
    envs.close()


def test_hashing_forks_keep_their_hashes():
    from gym_llm.envs.hashing import LLMHashingEnv, LLMHashingVectorEnv

    env = LLMHashingEnv(prompts=[[1, 2, 3]], vocab_size=50)
    env.reset(seed=0)
    env.step(5)
    (sibling,) = env.fork()
    assert sibling.get_state().hash == env.get_state().hash
    env.step(7)
    sibling.step(8)
    assert sibling.get_state().hash != env.get_state().hash
    fresh = LLMHashingEnv(prompts=[[1, 2, 3]], vocab_size=50)
    fresh.reset(seed=0)
    fresh.step(5)
    fresh.step(8)
    assert fresh.get_state().hash == sibling.get_state().hash
    envs = LLMHashingVectorEnv(4, prompts=[[1, 2, 3], [4, 5]], vocab_size=50)
    envs.reset(seed=0)
    envs.step([1, 2, 3, 4])
    envs.branch(0, [1, 2])
    assert envs.get_state(1).hash == envs.get_state(2).hash == envs.get_state(0).hash != envs.get_state(3).hash
    (scalar,) = envs.fork(3)
    assert type(scalar) is LLMHashingEnv and scalar.get_state().hash == envs.get_state(3).hash
    envs.step([9, 9, 8, 1])
    scalar.step(1)
    assert scalar.get_state().hash == envs.get_state(3).hash
    assert envs.get_state(1).hash == envs.get_state(0).hash != envs.get_state(2).hash
    for e in (env, sibling, fresh, envs, scalar):
        e.close()


def test_tools_that_cannot_fork_refuse_naming_why_and_nothing_leaks():
    from gym_llm.tools import MCPTool, PythonTool

    server = str(Path(__file__).resolve().parents[1] / "tools" / "mcp_server.py")
    python = PythonTool(min_idle=0)
    env = gym.make("LLMChat-v0", tools=[python, MCPTool(sys.executable, [server], name_prefix="srv_", include=["add"])],
                   max_turns=4).unwrapped
    env.reset(seed=0)
    env.step("```python\nx = 1\n```")
    (before_mcp,) = env.fork()  # no MCP call yet: nothing of the server's to copy
    env.step('<tool_call>{"name": "srv_add", "arguments": {"a": 2, "b": 40}}</tool_call>')
    with pytest.raises(ForkError, match="MCP"):
        env.fork()
    env.step("```python\nprint(x + 1)\n```")  # the parent goes on
    assert env.episode.messages[-1].content == "2\n"
    before_mcp.step("```python\nprint(x + 10)\n```")
    assert before_mcp.episode.messages[-1].content == "11\n"
    before_mcp.close()
    env.close()
    assert python._pool is None  # the refused fork left no sandbox leased


def test_a_browser_session_refuses_to_fork_naming_why():
    from gym_llm.tools import PythonTool
    from gym_llm.tools.browser.tool import BrowserTool
    from gym_llm.tools.handler import ToolSessions

    python, browser = PythonTool(min_idle=0), BrowserTool()
    sessions = ToolSessions()
    sessions._sessions = {id(python): python.open_session(), id(browser): browser.open_session()}
    with pytest.raises(ForkError, match="browser tool cannot be forked"):
        sessions.fork()


def test_fork_resource_copies_plain_data_forks_what_can_and_names_what_cannot():
    from gym_llm.core.episode import fork_resource

    class Forkable:
        def __init__(self, n):
            self.n = n

        def fork(self):
            return Forkable(self.n + 1)

    state = {"n": [1, 2], "arr": np.arange(3), "tool": Forkable(1), "t": (1, "a")}
    copy = fork_resource(state, "resource 'x'")
    copy["n"].append(3)
    copy["arr"][0] = 9
    assert state["n"] == [1, 2] and state["arr"][0] == 0 and copy["tool"].n == 2 and copy["t"] == (1, "a")

    class Workspace:  # e.g. an MLGym workspace: a sandbox of files and processes
        pass

    with pytest.raises(ForkError, match=r"resource 'x'\['workspace'\] is a .*Workspace, which has no fork"):
        fork_resource({"started": 1.0, "workspace": Workspace()}, "resource 'x'")


@pytest.mark.parametrize("mode", ["text", "tokens"])
def test_paused_sub_envs_are_left_as_they_are_and_a_snapshot_branches_later(mode):
    kwargs = make_kwargs("LLMChat-v0", mode)
    text = mode == "text"
    envs = gym.make_vec("LLMChat-v0", num_envs=3, vectorization_mode="vector_entry_point", **kwargs).unwrapped
    single = gym.make("LLMChat-v0", **kwargs).unwrapped
    obs, info = envs.reset(seed=4, options={"task_id": 0})
    envs.pause([1, 2])
    snap = envs.snapshot(0)  # sub-env 0 before its first turn
    acts = _actions(single, 1, 3)
    obs2, reward, terminated, truncated, info2 = envs.step(_stack(acts, text))
    for i in (1, 2):  # untouched: same observation, nothing happened
        assert _same(_row(obs2, i, text), _row(obs, i, text)) and reward[i] == 0 and not terminated[i]
        assert envs.episodes[i].turn == 0
    assert envs.episodes[0].turn == 1 and list(envs.paused) == [False, True, True]
    envs.branch(snap, [1, 2])  # 1 and 2 start from sub-env 0's state before its turn
    snap.close()
    envs.unpause([1, 2])
    obs3 = envs.step(_stack(acts, text))[0]
    fresh = gym.make("LLMChat-v0", **kwargs).unwrapped
    fresh.reset(options={"task_id": 0})
    want = _run(fresh, [acts[1]])[-1][0]
    assert _same(_row(obs3, 1, text), want)  # row 1 played acts[1] from the snapshot's state
    for e in (envs, single, fresh):
        e.close()
    hashing = gym.make_vec("LLMHashing-v0", num_envs=2, vectorization_mode="vector_entry_point",
                           vocab_size=50, prompts=[[1, 2]]).unwrapped
    with pytest.raises(NotImplementedError):
        hashing.pause([0])
    hashing.close()
