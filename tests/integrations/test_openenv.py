"""gym_llm envs over OpenEnv's protocol, driven by OpenEnv's own client (``GenericEnvClient``), and OpenEnv servers as
Gymnasium envs (``OpenEnv-v0``). Real servers (the ``gym-llm serve`` command in a subprocess, and in-process uvicorn
threads), real clients, real sandboxes; each episode is checked against the native env's for the same seed/task and
scripted replies."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

import gym_llm  # noqa: F401  (registers the ids)
import gym_llm.integrations.openenv as gym_llm_openenv  # its server names import OpenEnv on first use

def GenericEnvClient(*args, **kwargs):  # noqa: N802 (OpenEnv's class, imported where used: ~3 s of imports, which
    """pytest-xdist workers that do not run this file need not pay at collection)"""
    from openenv.core.generic_client import GenericEnvClient as client

    return client(*args, **kwargs)


pytestmark = pytest.mark.xdist_group("openenv")  # the servers are module fixtures: keep the file on one worker

ARITH = {"source": "arithmetic"}
PING_S = 0.5  # the in-process servers' ping interval and timeout: a frozen client is dropped within 2 * PING_S


# ------------------------------------------------------------------------------------------- policies, episodes
def sum_policy(messages: list[dict]) -> str:
    a, b = (int(x) for x in messages[-1]["content"].split("What is ")[1].split("?")[0].split(" + "))
    return f"{a} + {b} = {a + b}\n#### {a + b}"


def chat_policy(messages: list[dict]) -> str:
    return f"Reply number {sum(m['role'] == 'assistant' for m in messages) + 1}."


def tool_policy(messages: list[dict]) -> str:
    if messages[-1]["role"] == "tool":
        return f"The tool printed it.\n#### {messages[-1]['content'].strip()}"
    return "Let me compute.\n```python\nprint(6 * 7)\n```"


def native_episode(env_id: str, kwargs: dict, policy, *, seed: int | None = None, task_id: int | None = None):
    """[(observation, reward, terminated, truncated, info) per reset/step], the final conversation."""
    env = gym.make(env_id, **kwargs)
    obs, info = env.reset(seed=seed, options=None if task_id is None else {"task_id": task_id})
    steps, done = [(obs, None, False, False, info)], False
    while not done:
        messages = [m.to_dict() for m in env.unwrapped.episode.messages]
        obs, reward, terminated, truncated, info = env.step(policy(messages))
        steps.append((obs, float(reward), terminated, truncated, info))
        done = terminated or truncated
    messages = [m.to_dict() for m in env.unwrapped.episode.messages]
    env.close()
    return steps, messages


def as_step(result) -> tuple:
    o = result.observation
    assert result.done == (o["terminated"] or o["truncated"])
    return o["text"], result.reward, o["terminated"], o["truncated"], o["info"]


def without_timings(steps: list[tuple]) -> list[tuple]:
    """The steps with the tool calls' wall-clock ``duration_s`` left out (it differs between any two runs)."""
    def strip(info: dict) -> dict:
        if "tool_calls" not in info:
            return info
        calls = [{k: v for k, v in call.items() if k != "duration_s"} for call in json.loads(info["tool_calls"])]
        return {**info, "tool_calls": calls}

    return [(*step[:4], strip(step[4])) for step in steps]


def openenv_episode(url: str, policy, *, seed: int | None = None, task_id: int | None = None):
    """The same episode through OpenEnv's own client (its sync wrapper)."""
    fields = {k: v for k, v in (("seed", seed), ("task_id", task_id)) if v is not None}
    with GenericEnvClient(base_url=url).sync() as client:
        result = client.reset(**fields)
        steps = [as_step(result)]
        while not result.done:
            result = client.step(gym_llm_openenv.GymLLMAction(text=policy(result.observation["messages"])))
            steps.append(as_step(result))
        state = client.state()
    assert state["step_count"] == len(steps) - 1 and state["total_reward"] == sum(s[1] for s in steps[1:])
    return steps, result.observation["messages"]


# ----------------------------------------------------------------------------------------------------- servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def wait_until(predicate, timeout_s: float, interval_s: float = 0.02) -> float:
    """Seconds until ``predicate()`` held; fails after ``timeout_s``."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s"
        time.sleep(interval_s)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def gsm8k_server():
    """``gym-llm serve LLMGSM8K-v0`` as a user runs it: the CLI in its own process; yields (url, process)."""
    port = free_port()
    command = [sys.executable, "-m", "gym_llm_adapters.cli", "-q", "serve", "LLMGSM8K-v0", "--source", "arithmetic",
               "--port", str(port), "--max-sessions", "40"]
    # a user's shell, not this worker's environment: vLLM's CPU platform puts torch's libgomp in os.environ's
    # LD_PRELOAD of any process that imported it (an earlier in-process engine test here), which children inherit
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert server.poll() is None, server.stderr.read()
        try:
            return get_json(url + "/health")["status"] == "healthy"
        except (urllib.error.URLError, OSError):
            return False

    wait_until(healthy, 60, 0.1)
    yield url, server
    server.send_signal(signal.SIGINT)
    assert server.wait(15) == 0


@pytest.fixture(scope="module")
def gsm8k_url(gsm8k_server):
    return gsm8k_server[0]


@pytest.fixture(scope="module")
def chat_server():
    with gym_llm_openenv.start_server("LLMChat-v0", ping_interval_s=PING_S, ping_timeout_s=PING_S) as server:
        yield server


@pytest.fixture(scope="module")
def tool_kwargs(gsm8k_test_file):
    return {"data_files": str(gsm8k_test_file), "sandbox": {"min_idle": 0, "timeout_s": 10.0}}


@pytest.fixture(scope="module")
def tool_server(tool_kwargs):
    with gym_llm_openenv.start_server("LLMPythonTool-v0", tool_kwargs, ping_interval_s=PING_S,
                                      ping_timeout_s=PING_S) as server:
        yield server


# ------------------------------------------------------------------------------------------------------- tests
def test_single_turn_gsm8k_through_openenvs_client_is_the_native_episode(gsm8k_url):
    for seed in (0, 1):
        steps, messages = openenv_episode(gsm8k_url, sum_policy, seed=seed)
        assert (steps, messages) == native_episode("LLMGSM8K-v0", ARITH, sum_policy, seed=seed)
        assert steps[-1][1:4] == (1.0, True, False) and steps[-1][4]["correct"] is True
    steps, _ = openenv_episode(gsm8k_url, sum_policy, task_id=7)
    assert steps[0][4]["task_id"] == 7
    schema = get_json(gsm8k_url + "/schema")
    assert schema["action"]["required"] == ["text"] and "messages" in schema["observation"]["properties"]
    assert get_json(gsm8k_url + "/metadata")["name"] == "LLMGSM8K-v0"


def test_multi_turn_chat_is_the_native_episode(chat_server):
    steps, messages = openenv_episode(chat_server.url, chat_policy, task_id=0)
    assert (steps, messages) == native_episode("LLMChat-v0", {}, chat_policy, task_id=0)
    assert sum(m["role"] == "user" for m in messages) >= 2  # the scripted follow-ups came back as observations


def test_python_tool_runs_in_the_sandbox_and_is_the_native_episode(tool_server, tool_kwargs):
    steps, messages = openenv_episode(tool_server.url, tool_policy, task_id=3)
    assert [m["role"] for m in messages[-3:]] == ["assistant", "tool", "assistant"]
    assert messages[-2]["content"] == "42\n"  # the sandbox ran the call
    native_steps, native_messages = native_episode("LLMPythonTool-v0", tool_kwargs, tool_policy, task_id=3)
    assert messages == native_messages
    assert without_timings(steps) == without_timings(native_steps)
    assert json.loads(steps[1][4]["tool_calls"])[0]["status"] == "ok"  # info passed through
    wait_until(lambda: tool_server.sessions()["envs_open"] == 0, 5)


def test_32_concurrent_clients_hold_isolated_sessions(gsm8k_url):
    n = 32
    native = [native_episode("LLMGSM8K-v0", ARITH, sum_policy, seed=seed) for seed in range(n)]
    all_reset, counted, live = asyncio.Event(), asyncio.Event(), {}

    async def client(seed: int, counter: list[int]):
        async with GenericEnvClient(base_url=gsm8k_url, message_timeout_s=30) as env:
            result = await env.reset(seed=seed)
            steps = [as_step(result)]
            counter[0] += 1
            if counter[0] == n:
                all_reset.set()
            await asyncio.wait_for(all_reset.wait(), 30)  # all 32 sessions live at once...
            if seed == 0:
                live.update(await asyncio.to_thread(get_json, gsm8k_url + "/gym_llm/sessions"))
                counted.set()
            await asyncio.wait_for(counted.wait(), 30)  # ...until the server has counted them
            result = await env.step(gym_llm_openenv.GymLLMAction(text=sum_policy(result.observation["messages"])))
            steps.append(as_step(result))
            state = await env.state()
            return steps, result.observation["messages"], state

    async def main():
        counter = [0]
        return await asyncio.gather(*(client(seed, counter) for seed in range(n)))

    start = time.perf_counter()
    results = asyncio.run(main())
    elapsed = time.perf_counter() - start
    print(f"32 concurrent OpenEnv clients, one episode each: {elapsed:.2f} s")
    assert live["active_sessions"] == n and live["envs_open"] == n
    assert [(steps, messages) for steps, messages, _ in results] == native
    assert len({state["episode_id"] for _, _, state in results}) == n
    assert all(state["step_count"] == 1 and state["total_reward"] == 1.0 for _, _, state in results)
    wait_until(lambda: get_json(gsm8k_url + "/gym_llm/sessions")["active_sessions"] == 0, 5)


def test_bad_requests_get_protocol_errors_and_the_session_goes_on(gsm8k_url):
    with ws_connect(gsm8k_url.replace("http", "ws") + "/ws") as ws:
        def ask(message) -> dict:
            ws.send(message if isinstance(message, str) else json.dumps(message))
            return json.loads(ws.recv(timeout=10))

        def error(message) -> tuple[str, str]:
            answer = ask(message)
            assert answer["type"] == "error", answer
            return answer["data"]["code"], answer["data"]["message"]

        assert error({"type": "step", "data": {"text": "#### 1"}}) == (
            "EXECUTION_ERROR", "step before reset (or after the episode ended): send a reset first.")
        assert error("{not json")[0] == "INVALID_JSON"
        assert error({"type": "jump"}) == ("UNKNOWN_TYPE", "Unknown message type: jump")
        code, message = error({"type": "reset", "data": {"seed": 0, "level": 3}})
        assert code == "EXECUTION_ERROR" and "unknown fields ['level']" in message
        assert "seed must be an int >= 0" in error({"type": "reset", "data": {"seed": "zero"}})[1]
        assert ask({"type": "reset", "data": {"seed": 0}})["type"] == "observation"
        assert error({"type": "step", "data": {"text": 42}})[0] == "VALIDATION_ERROR"  # wrong action type
        assert error({"type": "step", "data": {"text": "#### 1", "tokens": [1, 2]}})[0] == "VALIDATION_ERROR"
        assert error({"type": "step", "data": {}})[0] == "VALIDATION_ERROR"
        assert "refused the reply" in error({"type": "step", "data": {"text": "x" * 20000}})[1]  # > the action space
        answer = ask({"type": "step", "data": {"text": "#### 6"}})  # the episode is intact after all that
        assert answer["type"] == "observation" and answer["data"]["done"] is True
        assert error({"type": "step", "data": {"text": "#### 6"}})[0] == "EXECUTION_ERROR"  # after the end
    reset = urllib.request.Request(gsm8k_url + "/reset", data=json.dumps({"seed": 0}).encode(),
                                   headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(reset, timeout=5) as response:  # OpenEnv's stateless HTTP reset: a fresh env
        assert json.loads(response.read())["observation"]["info"]["round"] == 0
    request = urllib.request.Request(gsm8k_url + "/step", data=json.dumps({"action": {"text": 1}}).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=5)
    assert e.value.code == 422
    request.data = json.dumps({"action": {"text": "#### 1"}}).encode()
    with pytest.raises(urllib.error.HTTPError) as e:  # HTTP is stateless in OpenEnv: a fresh env, never reset
        urllib.request.urlopen(request, timeout=5)
    assert e.value.code == 409 and "send a reset first" in json.loads(e.value.read())["detail"]
    with ws_connect(gsm8k_url.replace("http", "ws") + "/ws") as ws:  # a bytes frame ends that connection only
        ws.send(b"\x00\x01")
        assert json.loads(ws.recv(timeout=10))["data"]["code"] == "SESSION_ERROR"
    assert get_json(gsm8k_url + "/health")["status"] == "healthy"
    steps, _ = openenv_episode(gsm8k_url, sum_policy, seed=0)
    assert steps[-1][1] == 1.0


def test_more_sessions_than_allowed_are_refused_with_capacity_reached():
    with gym_llm_openenv.start_server("LLMChat-v0", max_sessions=1) as server:
        first = GenericEnvClient(base_url=server.url).sync()
        first.connect()
        first.reset(task_id=0)
        with ws_connect(server.url.replace("http", "ws") + "/ws") as ws:  # the server says why, then closes
            answer = json.loads(ws.recv(timeout=10))
        assert answer["data"]["code"] == "CAPACITY_REACHED" and answer["data"]["max_sessions"] == 1
        with pytest.raises((RuntimeError, ConnectionClosed)), GenericEnvClient(base_url=server.url).sync() as refused:
            refused.reset()  # OpenEnv's client sends first: it reads the reason, or finds the socket closed
        assert first.step({"text": "Hello."}).observation["info"]["task_id"] == 0  # the first session goes on
        first.close()
        wait_until(lambda: server.sessions()["active_sessions"] == 0, 5)
        with GenericEnvClient(base_url=server.url).sync() as again:
            assert again.reset(task_id=0).observation["info"]["task_id"] == 0


VANISHING_CLIENT = textwrap.dedent("""
    import json, sys
    from websockets.sync.client import connect
    with connect(sys.argv[1].replace("http", "ws") + "/ws") as ws:  # OpenEnv's protocol (its client: 5 s imports)
        ws.send(json.dumps({"type": "reset", "data": {"task_id": int(sys.argv[2])}}))
        ws.recv()
        ws.send(json.dumps({"type": "step", "data": {"text": sys.argv[3]}}))
        assert json.loads(ws.recv())["data"]["done"] is False
        print("mid-episode", flush=True)
        sys.stdin.read()
""")


def sandbox_pids() -> set[int]:
    """The bubblewrap processes under this one (the in-process servers' Python sandboxes), read from /proc."""
    parents, names = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        pid, rest = text.split(" (", 1)
        name, fields = rest.rsplit(") ", 1)
        parents[int(pid)], names[int(pid)] = int(fields.split()[1]), name
    under, todo = set(), [os.getpid()]
    while todo:
        above = todo.pop()
        children = [pid for pid, parent in parents.items() if parent == above]
        under.update(children)
        todo.extend(children)
    return {pid for pid in under if names[pid] == "bwrap"}


def start_vanishing_client(url: str, task_id: int, reply: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", VANISHING_CLIENT, url, str(task_id), reply],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_vanished_clients_free_their_sessions_and_envs(tool_server, chat_server):
    """A killed client (its sockets closed by the kernel) frees its session and sandbox at once; a frozen one (no
    pongs: a stopped process, a lost network) within ping interval + timeout. Both start together (imports)."""
    before = sandbox_pids()  # sandboxes other tests in this worker keep (pooled envs): not the killed client's
    killed = start_vanishing_client(tool_server.url, 3, "Let me compute.\n```python\nx = 6 * 7\n```")
    frozen = start_vanishing_client(chat_server.url, 0, "Hello.")
    try:
        for client in (killed, frozen):
            assert client.stdout.readline().strip() == "mid-episode"
        assert tool_server.sessions()["active_sessions"] == 1 and tool_server.sessions()["envs_open"] == 1
        sandboxes = sandbox_pids() - before
        assert sandboxes  # the killed client's episode has a live sandbox
        killed.kill()
        freed_s = wait_until(lambda: tool_server.sessions()["active_sessions"] == 0
                             and tool_server.sessions()["envs_open"] == 0, 5)
        print(f"killed client: session and env freed in {freed_s:.3f} s")
        wait_until(lambda: not sandboxes & sandbox_pids(), 5)  # and its sandbox processes are gone
        assert chat_server.sessions()["active_sessions"] == 1
        os.kill(frozen.pid, signal.SIGSTOP)
        # the session goes when the ping times out, its env as its close completes (a moment later: seen 1 open
        # right after the session went, on a loaded 2-core Xeon): both within the bound
        freed_s = wait_until(lambda: chat_server.sessions()["active_sessions"] == 0
                             and chat_server.sessions()["envs_open"] == 0, 4 * PING_S + 1)
        print(f"frozen client: session and env freed in {freed_s:.3f} s (ping interval + timeout = {2 * PING_S} s)")
    finally:
        for client in (killed, frozen):
            client.kill()
            os.kill(client.pid, signal.SIGCONT) if client.poll() is None else None
            client.wait(5)


def test_openenv_v0_drives_a_server_as_the_native_env(gsm8k_url, chat_server):
    env = gym.make("OpenEnv-v0", base_url=gsm8k_url)
    assert env.unwrapped.action_field == "text" and env.unwrapped.observation_field == "text"
    obs, info = env.reset(seed=1)
    steps = [(obs, None, False, False, info)]
    obs, reward, terminated, truncated, info = env.step(sum_policy(env.unwrapped.last_observation["messages"]))
    steps.append((obs, reward, terminated, truncated, info))
    native, _ = native_episode("LLMGSM8K-v0", ARITH, sum_policy, seed=1)
    assert steps == native
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()

    env = gym.make("OpenEnv-v0", base_url=chat_server.url)
    obs, info = env.reset(options={"task_id": 0})
    steps, done = [(obs, None, False, False, info)], False
    while not done:
        obs, reward, terminated, truncated, info = env.step(chat_policy(env.unwrapped.last_observation["messages"]))
        steps.append((obs, reward, terminated, truncated, info))
        done = terminated or truncated
    assert steps == native_episode("LLMChat-v0", {}, chat_policy, task_id=0)[0]
    with pytest.raises(RuntimeError, match="refused step: .*send a reset first"):
        env.step("one more")
    env.close()


def test_openenv_v0_drives_any_openenv_server():
    """A plain OpenEnv env (not gym_llm's), served by OpenEnv's own create_fastapi_app: the action field, observation
    field and info come from its schema."""
    import threading

    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class EchoAction(Action):
        message: str

    class EchoObservation(Observation):
        echoed: str = ""
        length: int = 0

    class EchoEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State()

        def reset(self, seed=None, episode_id=None, **kwargs):
            self._state = State(episode_id=episode_id or "echo")
            return EchoObservation(echoed="ready")

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            return EchoObservation(echoed=action.message, length=len(action.message), reward=len(action.message),
                                   done=self._state.step_count == 2)

        @property
        def state(self):
            return self._state

    app = create_fastapi_app(EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=4)
    # log_level: OpenEnv 0.3.0's own app logs a traceback each time a client closes (the noise create_app silences)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10)
    try:
        port = server.servers[0].sockets[0].getsockname()[1]
        env = gym.make("OpenEnv-v0", base_url=f"http://127.0.0.1:{port}")
        assert (env.unwrapped.action_field, env.unwrapped.observation_field) == ("message", "echoed")
        assert env.reset(seed=0) == ("ready", {"length": 0})
        assert env.step("héllo") == ("héllo", 5.0, False, False, {"length": 5})
        assert env.step("") == ("", 0.0, True, False, {"length": 0})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_env(env.unwrapped)
        env.close()
    finally:
        server.should_exit = True
        thread.join(10)


def test_openenv_v0_says_what_to_pass():
    with pytest.raises(ConnectionError, match="is an OpenEnv server running at base_url"):
        gym.make("OpenEnv-v0", base_url=f"http://127.0.0.1:{free_port()}", connect_timeout_s=2)
    with pytest.raises(ValueError, match="base_url='http://host:port'"):
        gym.make("OpenEnv-v0", base_url="localhost:8000")
    from gym_llm.integrations.openenv_client import _action_field

    schema = {"properties": {"code": {"type": "string"}, "lang": {"type": "string"}, "metadata": {}},
              "required": ["code", "lang"]}
    with pytest.raises(ValueError, match=r"Pass action_field='<name>'"):
        _action_field(schema)
    assert _action_field({**schema, "required": ["code"]}) == "code"


def test_servers_refuse_what_they_cannot_serve():
    with pytest.raises(ValueError, match="unknown gym_llm env id 'LLMGSM8K'"):
        gym_llm_openenv.create_app("LLMGSM8K")
    with pytest.raises(ValueError, match="speaks text"):
        gym_llm_openenv.create_app("LLMChat-v0", {"mode": "tokens"})
    with pytest.raises(ValueError, match="not a text env"):
        gym_llm_openenv.create_app("LLMHashing-v0", {"vocab_size": 16, "prompts": [[1, 2]]})
    with pytest.raises(ValueError, match="max_sessions must be an int >= 1"):
        gym_llm_openenv.create_app("LLMChat-v0", max_sessions=0)


def test_serve_command_refuses_bad_input_in_one_line():
    def serve(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gym_llm_adapters.cli", "serve", *args], capture_output=True,
                              text=True, timeout=60, check=False)

    out = serve("LLMGSM8K", "--port", "1")
    assert out.returncode == 2 and "did you mean 'LLMGSM8K-v0'" in out.stderr
    out = serve("LLMGSM8K-v0", "--data-files", "no/such.jsonl")
    assert out.returncode == 2 and "no such file" in out.stderr


def test_the_server_process_loads_no_torch(gsm8k_server):
    """The ``gym-llm serve`` process (CLI, integration, OpenEnv, a served env) mapped no torch library."""
    with open(f"/proc/{gsm8k_server[1].pid}/maps") as f:
        libraries = {line.split()[-1] for line in f if line.rstrip().endswith(".so") or ".so." in line}
    assert libraries and not [lib for lib in libraries if "torch" in lib or "vllm" in lib]
