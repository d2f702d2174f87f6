"""gym_llm envs as verifiers (0.4.0) environments, loaded by verifiers' own loader from the taskset id
``gym_llm_verifiers`` and run the way ``vf-eval`` runs them (``env.serving()`` + ``env.run_episode``): real
interception server, real eval client, real agent interaction. The model is a small OpenAI-compatible HTTP server
started here that replays a scripted policy; each episode's requests (the prompts the model saw), trace (the
conversation) and rewards are checked against the native gym_llm env's for the same task and replies."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest

import gym_llm  # noqa: F401  (registers the ids)


class _OnUse:
    """A module imported at its first attribute use: verifiers (and the integration, which subclasses its classes)
    import in ~3 s, which the pytest-xdist worker that does not run this file need not pay at collection."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        import importlib

        if attribute.startswith("_"):  # pytest's collection looks for its own markers on every module attribute
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self._name), attribute)


vf = _OnUse("verifiers.v1")
gv = _OnUse("gym_llm.integrations.verifiers")

pytestmark = pytest.mark.xdist_group("verifiers")  # one scripted model, one vf-eval subprocess: one worker

ARITH = {"source": "arithmetic"}


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


def ifeval_policy(messages: list[dict]) -> str:
    return "HELLO WORLD. THIS REPLY IS WRITTEN IN CAPITAL LETTERS ONLY WITH NO COMMAS AT ALL.\n"


POLICIES = {"sum": sum_policy, "chat": chat_policy, "tool": tool_policy, "ifeval": ifeval_policy}


class ScriptedModel:
    """An OpenAI-compatible ``/v1/chat/completions`` server whose model names are the policies in ``POLICIES``: it
    answers with ``POLICIES[body["model"]](body["messages"])`` and records every request body per model."""

    def __init__(self):
        self.requests: dict[str, list[dict]] = {name: [] for name in POLICIES}
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                requests[body["model"]].append(body)
                data = json.dumps({
                    "id": "chatcmpl-scripted", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {
                        "role": "assistant", "content": POLICIES[body["model"]](body["messages"])}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ctx(self, policy: str):
        """What ``vf-eval -m <policy> --client.base-url ...`` gives the env."""
        from verifiers.v1.clients import EvalClientConfig, ModelContext

        return ModelContext(model=policy, client=EvalClientConfig(base_url=self.base_url,
                                                                  api_key_var="GYM_LLM_SCRIPTED_KEY"))


@pytest.fixture(scope="module")
def model():
    server = ScriptedModel()
    yield server
    server.server.shutdown()


@pytest.fixture(scope="module", autouse=True)
def vf_eval(model, tmp_path_factory):
    """verifiers' own CLI, ``vf-eval gym_llm_verifiers --env.taskset.env-id LLMGSM8K-v0 ...``, against the scripted
    model in a subprocess started with the module's first test (it runs beside the others); the subprocess then
    prints which torch-family modules the whole run imported."""
    out_dir = tmp_path_factory.mktemp("vf_eval")
    code = ("import sys; from verifiers.v1.cli.eval.main import main; main(sys.argv[1:]); "
            "print('IMPORTED', [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vllm')])")
    argv = [gv.TASKSET_ID, "--env.taskset.env-id", "LLMGSM8K-v0", "--env.taskset.env-kwargs", json.dumps(ARITH),
            "-m", "sum", "--client.base-url", model.base_url, "--client.api-key-var", "GYM_LLM_SCRIPTED_KEY",
            "-n", "3", "--output-dir", str(out_dir), "--push", "false", "--rich", "None"]
    process = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    yield process, out_dir
    if process.poll() is None:
        process.kill()
        process.wait()


def run_episodes(env: vf.Env, model: ScriptedModel, policy: str, tasks) -> list[tuple[vf.Episode, list[dict]]]:
    """verifiers' eval loop, one episode at a time: (episode, the request bodies the model got for it)."""

    async def main():
        out = []
        async with env.serving():
            for task in tasks:
                start = len(model.requests[policy])
                episode = await env.run_episode(task, model.ctx(policy))
                out.append((episode, model.requests[policy][start:]))
        return out

    return asyncio.run(main())


def native_episode(env_id: str, kwargs: dict, task_id: int, policy) -> tuple[list[list[dict]], list[dict], list[float]]:
    """(the history before each reply, the final conversation, the step rewards) of the native env."""
    env = gym.make(env_id, **kwargs)
    env.reset(options={"task_id": task_id})
    prompts, rewards, done = [], [], False
    while not done:
        history = [m.to_dict() for m in env.unwrapped.episode.messages]
        prompts.append(history)
        _, reward, terminated, truncated, _ = env.step(policy(history))
        rewards.append(float(reward))
        done = terminated or truncated
    messages = [m.to_dict() for m in env.unwrapped.episode.messages]
    env.close()
    return prompts, messages, rewards


def plain(messages) -> list[tuple[str, str]]:
    """(role, content) of OpenAI-form dicts or verifiers messages."""
    dicts = [m if isinstance(m, dict) else m.model_dump() for m in messages]
    return [(m["role"], m["content"]) for m in dicts]


def assert_matches_native(env_id, kwargs, task_id, policy, episode, requests):
    prompts, messages, rewards = native_episode(env_id, kwargs, task_id, policy)
    assert episode.ok, episode.errors
    (trace,) = episode.traces
    assert [plain(r["messages"]) for r in requests] == [plain(p) for p in prompts]  # what the model saw
    assert plain(trace.messages) == plain(messages)  # the conversation verifiers recorded
    assert trace.info["gym_llm"]["rewards"] == rewards
    assert trace.rewards[gv.REWARD_NAME].score == pytest.approx(sum(rewards))
    assert trace.reward == pytest.approx(sum(rewards))
    return trace, rewards


# ------------------------------------------------------------------------------------------- tests
def test_verifiers_loader_finds_the_gym_llm_plugin():
    assert vf.environment_class(gv.TASKSET_ID) is gv.GymLLMEnv
    assert vf.import_taskset(gv.TASKSET_ID).GymLLMTaskset is gv.GymLLMTaskset
    assert vf.default_harness_id(gv.TASKSET_ID) == gv.TASKSET_ID  # the taskset's own harness, not verifiers' bash
    assert vf.taskset_config_type(gv.TASKSET_ID) is gv.GymLLMTasksetConfig
    config = vf.resolve_env_config({"taskset": {"id": gv.TASKSET_ID, "env_id": "LLMGSM8K-v0", "env_kwargs": ARITH}})
    env = vf.load_environment(config)
    assert isinstance(env, gv.GymLLMEnv) and isinstance(env._harnesses["agent"], gv.GymLLMHarness)
    assert env.config.agent.runtime.type == "subprocess"


def test_single_turn_gsm8k_matches_the_native_env(model):
    env = gv.load_environment("LLMGSM8K-v0", env_kwargs=ARITH, task_ids=[0, 3])
    tasks = list(env.taskset)
    assert [t.key for t in tasks] == ["LLMGSM8K-v0#0", "LLMGSM8K-v0#3"]
    assert tasks[0].data.prompt[0].content.startswith("What is ")
    for task, (episode, requests) in zip(tasks, run_episodes(env, model, "sum", tasks), strict=True):
        trace, rewards = assert_matches_native("LLMGSM8K-v0", ARITH, task.data.task_id, sum_policy, episode, requests)
        assert rewards == [1.0]
        assert trace.metrics["correct"] == 1.0 and trace.info["gym_llm"]["ended"] == "terminated"


def test_ifeval_rewards_are_the_env_checkers(model, ifeval_file):
    kwargs = {"data_files": str(ifeval_file)}
    env = gv.load_environment("LLMIFEval-v0", env_kwargs=kwargs, task_ids=[0, 1])
    tasks = list(env.taskset)
    traces = [assert_matches_native("LLMIFEval-v0", kwargs, task.data.task_id, ifeval_policy, episode, requests)[0]
              for task, (episode, requests) in zip(tasks, run_episodes(env, model, "ifeval", tasks), strict=True)]
    # task 0 asks for no commas, 3 highlighted sections and 300+ words; task 1 only for no commas
    assert [t.metrics["prompt_strict"] for t in traces] == [0.0, 1.0]  # IFEval's verdicts ride along as metrics
    assert traces[0].metrics["instruction_strict_fraction"] == pytest.approx(1 / 3)
    assert traces[0].reward < traces[1].reward == 1.0


async def count_replies(trace) -> float:
    """A verifiers reward function (plugged by import path): the assistant turns of the trace."""
    return float(len(trace.assistant_messages))


def test_multi_turn_chat_and_python_tool_match_the_native_env(model, gsm8k_test_file):
    env = gv.load_environment("LLMChat-v0", task_ids=[0])
    [(episode, requests)] = run_episodes(env, model, "chat", list(env.taskset))
    trace, _ = assert_matches_native("LLMChat-v0", {}, 0, chat_policy, episode, requests)
    assert sum(m.role == "user" for m in trace.messages) >= 2  # the scripted user's next turns came back
    assert len(requests) == trace.num_turns >= 2

    # the chat env's reward is a Python function: under verifiers it is a reward function plugged by import path
    plugged = {"task": {"rewards": {"replies": {"fn": f"{__name__}:count_replies", "weight": 0.5}}}}
    env = gv.load_environment("LLMChat-v0", task_ids=[0], taskset=plugged)
    [(episode, requests)] = run_episodes(env, model, "chat", list(env.taskset))
    (trace,) = episode.traces
    assert trace.rewards["replies"].score == len(requests) and trace.reward == 0.5 * len(requests)

    kwargs = {"data_files": str(gsm8k_test_file), "sandbox": {"min_idle": 0, "timeout_s": 10.0}}
    env = gv.load_environment("LLMPythonTool-v0", env_kwargs=kwargs, task_ids=[3])
    [(episode, requests)] = run_episodes(env, model, "tool", list(env.taskset))
    trace, _ = assert_matches_native("LLMPythonTool-v0", kwargs, 3, tool_policy, episode, requests)
    assert [m.role for m in trace.messages[-3:]] == ["assistant", "tool", "assistant"]
    assert trace.messages[-2].content == "42\n"  # the gym_llm sandbox ran the code; its output is a tool turn
    assert requests[1]["messages"][-1]["role"] == "tool"
    assert trace.messages[-2].tool_call_id == f"gym_llm-tool-{len(trace.messages) - 2}"  # its index in the episode


def test_agent_limits_end_the_episode_early(model):
    """``--env.agent.max-turns 1`` on a multi-turn chat: verifiers stops after one reply; the gym_llm episode is left
    unfinished and says so."""
    env = gv.load_environment("LLMChat-v0", task_ids=[0], agent={"max_turns": 1})
    [(episode, requests)] = run_episodes(env, model, "chat", list(env.taskset))
    (trace,) = episode.traces
    assert len(requests) == 1 and trace.stop_condition == "max_turns"
    assert trace.info["gym_llm"] == {"env_id": "LLMChat-v0", "task_id": 0, "rewards": [0.0], "ended": "agent_stopped"}


def test_bad_configuration_says_what_to_pass():
    with pytest.raises(ValueError, match=r"expected a registered gym_llm env id.*got 'LLMNope-v0'.*env-id"):
        gv.load_environment("LLMNope-v0")
    with pytest.raises(ValueError, match="got ''"):  # the id alone parses (verifiers' CLI does that), then says
        vf.load_environment(vf.resolve_env_config({"taskset": {"id": gv.TASKSET_ID}}))
    with pytest.raises(ValueError, match="verifiers speaks text.*Drop 'mode'"):
        gv.load_environment("LLMGSM8K-v0", env_kwargs={**ARITH, "mode": "tokens"})
    with pytest.raises(ValueError, match="expected JSON values"):
        gv.load_environment("LLMChat-v0", env_kwargs={"reward_fn": lambda task, messages: 1.0})
    with pytest.raises(ValueError, match="indices >= 0"):
        gv.load_environment("LLMGSM8K-v0", env_kwargs=ARITH, task_ids=[-1])
    with pytest.raises(ValueError, match="expected a chat env.*got LLMTokens-v0"):
        list(gv.load_environment("LLMTokens-v0").taskset)
    env = gv.load_environment("LLMChat-v0", task_ids=[10_000])
    with pytest.raises(ValueError, match=r"task source has \d+ tasks.*got 10000"):
        list(env.taskset)


def test_a_missing_verifiers_names_the_extra():
    hide = "import sys; sys.modules['verifiers'] = None; sys.modules['verifiers.v1'] = None\n"
    probe = hide + "try:\n    import gym_llm.integrations.verifiers\nexcept ImportError as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "pip install 'gym-llm[verifiers]'" in out and "verifiers 0.4.0" in out


def test_vf_eval_runs_a_gym_llm_env_and_imports_no_torch(vf_eval):
    process, out_dir = vf_eval
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    assert "IMPORTED []" in output
    (traces_file,) = out_dir.glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines()]
    traces = [trace for episode in episodes for trace in episode["traces"]]
    assert sorted(t["task"]["data"]["task_id"] for t in traces) == [0, 1, 2]
    assert [t["rewards"][gv.REWARD_NAME]["score"] for t in traces] == [1.0, 1.0, 1.0]
