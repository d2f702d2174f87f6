"""LLMBrowser-v0 with a real Chromium: every built-in task solvable by browsing, rewards, vector envs, lifecycle."""

from __future__ import annotations

import json
import socket
import threading

import gymnasium as gym
import numpy as np
import pytest

import gym_llm  # noqa: F401  (registers the ids)
from gym_llm.envs.browser import LLMBrowserEnv
from gym_llm.tasks.larkspur import SITE_TASKS

pytestmark = pytest.mark.slow

SITE = "http://larkspur.test"


def call(action: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": "browser_" + action, "arguments": arguments})}</tool_call>'


# task id -> (the calls that find the fact, the fact as the last page shows it)
ORACLE = {
    0: ([call("navigate", url=SITE + "/wiki/"), call("click", text="Greywater Point Lighthouse")], "1874"),
    1: ([call("navigate", url=SITE + "/wiki/greywater-point-lighthouse"), call("click", text="Tobias Merrow")],
        "Ellesport"),
    2: ([call("navigate", url=SITE + "/wiki/"), call("click", text="Larkspur Harbor")], "4,087"),
    3: ([call("navigate", url=SITE + "/"), call("click", text="Town wiki"), call("click", text="Kelp Festival")],
        "14 September"),
    4: ([call("navigate", url=SITE + "/wiki/"), call("type", field="Search the wiki", text="mill", submit=True),
         call("click", text="Old Mill on Brindle Creek")], "barley"),
    5: ([call("navigate", url=SITE + "/shop/"), call("click", text="Next page"), call("click", text="Brass tide clock")],
        "$86.50"),
    6: ([call("navigate", url=SITE + "/shop/?page=2"), call("click", text="Storm lantern"),
         call("click", text="Show specifications")], "1.8 kg"),
    7: ([call("navigate", url=SITE + "/shop/"), call("click", text="Next page"), call("click", text="Next page")],
        "Tin whistle"),
    8: ([call("navigate", url=SITE + "/account"), call("type", field="Username", text="mira"),
         call("type", field="Password", text="saltwater", submit=True)], "HS-40317"),
    9: ([call("navigate", url=SITE + "/wiki/larkspur-harbor"), call("click", text="Agnes Thorncliffe")], "Harwick"),
    10: ([call("navigate", url=SITE + "/account"), call("type", field="Username", text="tomas"),
          call("type", field="Password", text="ropewalk", submit=True)], "processing"),
    11: ([call("navigate", url=SITE + "/ferry"), call("type", field="Destination", text="Gannet Rock"),
           call("click", text="Show departures")], "17:40"),
}


def reference(task_id: int) -> str:
    return SITE_TASKS[task_id].answers[0]


@pytest.fixture(scope="module")
def env():
    env = LLMBrowserEnv(browser={"page_view": "text"})
    yield env
    env.close()


def test_every_builtin_task_is_solved_by_browsing(env):
    assert set(ORACLE) == set(range(len(SITE_TASKS)))
    runtime = env.unwrapped.parts.extra["browser_tool"].runtime
    for task_id, (calls, fact) in ORACLE.items():
        obs, info = env.reset(options={"task_id": task_id})
        assert SITE_TASKS[task_id].question in obs and f"{SITE}/" in obs
        assert len(runtime._tabs) == 0  # the last episode's browser context was closed by the reset
        obs, reward, terminated, truncated, info = env.step("Let me look.\n" + "".join(calls))
        statuses = [c["status"] for c in json.loads(info["tool_calls"])]
        assert statuses == ["ok"] * len(calls) and not terminated, (task_id, env.unwrapped.episode.messages[-1])
        pages = [m.content for m in env.unwrapped.episode.messages[-len(calls):]]
        assert fact in pages[-1], (task_id, pages[-1])
        assert fact not in pages[-2] or task_id not in (6, 8, 10, 11)  # needed the click / login / form
        obs, reward, terminated, truncated, info = env.step(f"I found it.\nAnswer: {fact}")
        assert (reward, terminated, info["correct"]) == (1.0, True, True), task_id
        assert runtime.tabs_opened == task_id + 1  # one context per episode
    assert runtime.launches == 1


def test_only_the_virtual_site_host_is_reachable(env):
    env.reset(options={"task_id": 0})
    site = env.unwrapped.parts.extra["site"]
    calls = call("navigate", url=f"http://{site.address}/") + call("navigate", url="http://localhost/")
    env.step(calls)
    replies = [m.content for m in env.unwrapped.episode.messages[-2:]]
    assert all("is not on the allow-list; allowed hosts: larkspur.test:80" in r for r in replies), replies


def test_rewards_need_the_right_answer_on_the_answer_line(env):
    env.reset(options={"task_id": 0})
    _, reward, terminated, _, info = env.step("Answer: 1875")
    assert (reward, terminated, info["correct"], info["formatted"]) == (0.0, True, False, True)
    assert info["reference_answer"] == "1874" and info["extracted_answer"] == "1875"
    env.reset(options={"task_id": 0})
    _, reward, _, _, info = env.step("It was first lit in 1874.")  # no Answer: line; the last line is compared
    assert (reward, info["formatted"], info["extracted_answer"]) == (0.0, False, "It was first lit in 1874.")
    env.reset(options={"task_id": 5})
    assert env.step("**Answer:** 86.50")[1] == 1.0  # an accepted alias, markdown allowed
    with_format = LLMBrowserEnv(format_reward=0.25)
    with_format.reset(options={"task_id": 2})
    assert with_format.step("Answer: 4087")[1] == 1.25
    with_format.close()


def test_last_turn_is_scored_without_browsing():
    env = LLMBrowserEnv(max_turns=2)
    env.reset(options={"task_id": 9})
    assert env.step(call("navigate", url=SITE + "/"))[2] is False
    _, reward, terminated, truncated, info = env.step(call("click", text="Town wiki") + "\nAnswer: Harwick")
    assert (reward, terminated, truncated, info["num_tool_calls_skipped"]) == (1.0, True, False, 1)
    env.close()


def test_native_vector_env_shares_one_browser_with_a_context_per_sub_env():
    envs = gym.make_vec("LLMBrowser-v0", num_envs=4, group_size=2, browser={"page_view": "text"})
    runtime = envs.unwrapped.parts.extra["browser_tool"].runtime
    obs, info = envs.reset(seed=3)
    assert info["task_id"][0] == info["task_id"][1] and info["task_id"][2] == info["task_id"][3]  # groups
    obs, rewards, terminated, truncated, info = envs.step((call("navigate", url=SITE + "/wiki/"),) * 4)
    assert all("Greywater Point Lighthouse" in o for o in obs) and not terminated.any()
    assert runtime.launches == 1 and len(runtime._tabs) == 4
    answers = tuple(f"Answer: {reference(int(t))}" for t in info["task_id"])
    obs, rewards, terminated, truncated, info = envs.step(answers)
    np.testing.assert_array_equal(rewards, [1.0] * 4)
    assert terminated.all() and len(runtime._tabs) == 0  # autoreset closed every episode's context
    envs.close()
    assert runtime.closed


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_gymnasium_vector_envs(mode):
    # Gymnasium's shared memory cannot hold Unicode text observations: the async workers send them by pipe.
    vector_kwargs = {"shared_memory": False} if mode == "async" else {}
    envs = gym.make_vec("LLMBrowser-v0", num_envs=2, vectorization_mode=mode, browser={"page_view": "text"},
                        vector_kwargs=vector_kwargs)
    obs, info = envs.reset(seed=7)
    obs, rewards, terminated, _, info = envs.step((call("navigate", url=SITE + "/ferry"),) * 2)
    assert all("Ferry timetable" in o for o in obs) and not terminated.any()
    _, rewards, terminated, _, _ = envs.step(tuple(f"Answer: {reference(int(t))}" for t in info["task_id"]))
    np.testing.assert_array_equal(rewards, [1.0, 1.0])
    envs.close()


def test_close_stops_the_site_and_the_browser():
    env = LLMBrowserEnv()
    env.reset(options={"task_id": 0})
    env.step(call("navigate", url=SITE + "/"))
    site, runtime = env.unwrapped.parts.extra["site"], env.unwrapped.parts.extra["browser_tool"].runtime
    env.close()
    assert runtime.closed and not runtime.thread.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", site.port), timeout=1.0)


def test_own_static_site_and_tasks(tmp_path):
    (tmp_path / "index.html").write_text('<html><body><a href="keeper.html">The keeper</a></body></html>')
    (tmp_path / "keeper.html").write_text("<html><body><p>The keeper's cat is called Biscuit.</p></body></html>")
    env = LLMBrowserEnv(site_dir=tmp_path, site_host="docs.test",
                        tasks=[{"question": "What is the keeper's cat called?", "answer": ["Biscuit"]}])
    obs, _ = env.reset(seed=0)
    assert "http://docs.test/" in obs
    obs, *_ = env.step(call("navigate", url="http://docs.test/") + call("click", text="The keeper"))
    assert "called Biscuit" in env.unwrapped.episode.messages[-1].content
    assert env.step("Answer: biscuit")[1] == 1.0
    env.close()


def test_tokens_mode_appends_the_tool_turn_as_new_tokens(tiny_tok):
    env = LLMBrowserEnv(mode="tokens", tokenizer=tiny_tok, max_seq_len=8192, max_action_tokens=256,
                        browser={"page_view": "text", "max_output_chars": 400})
    obs, info = env.reset(options={"task_id": 3})
    n0 = int(obs["attention_mask"].sum())
    action = tiny_tok.encode(call("navigate", url=SITE + "/wiki/kelp-festival"))
    obs, reward, terminated, truncated, info = env.step(action)
    n1 = int(obs["attention_mask"].sum())
    assert not terminated and n1 > n0 + len(action)
    np.testing.assert_array_equal(obs["input_ids"][n0:n0 + len(action)], action)  # sampled ids kept verbatim
    assert info["policy_mask"][n0:n0 + len(action)].all() and not info["policy_mask"][n0 + len(action):n1].any()
    assert "14 September" in tiny_tok.decode(obs["input_ids"][n0 + len(action):n1])
    env.close()


def _site_threads() -> int:
    return sum(t.name == "gym_llm_site" for t in threading.enumerate())


@pytest.mark.parametrize("kwargs, error, needle", [
    ({"tasks": [{"question": "q"}]}, ValueError, "needs 'question'"),
    ({"tasks": [{"question": "q", "answer": []}]}, ValueError, "non-empty list"),
    ({"prompt_template": "no placeholder"}, ValueError, "{question}"),
    ({"browser": {"host_map": {"a.test": "127.0.0.1:1"}}}, ValueError, "must not set"),
    ({"browser": {"speed": 2}}, TypeError, "Unknown BrowserTool setting"),
    ({"site_dir": "."}, ValueError, "pass tasks="),
    ({"site_dir": "/nonexistent", "tasks": [{"question": "q", "answer": "a"}]}, FileNotFoundError, "not a directory"),
    ({"tools": "python"}, TypeError, "list of extra tools"),
])
def test_bad_arguments_raise_and_leave_no_server_running(kwargs, error, needle):
    before = _site_threads()
    with pytest.raises(error, match=needle.replace("(", r"\(").replace("{", r"\{").replace("}", r"\}")):
        LLMBrowserEnv(**kwargs)
    assert _site_threads() == before
