"""One seeded episode per env kind, one scripted policy, every way of running it: the same episode.

The kinds: single-turn GSM8K (arithmetic), multi-turn chat (scripted user follow-ups), the sandboxed Python tool (a
``<tool_call>``, then the answer) and hashing (token ids as actions). The ways: the native scalar and vector envs,
Gymnasium's ``AsyncVectorEnv`` (worker processes), TorchRL (``gym_llm_adapters.torchrl.GymLLMEnv``), SkyRL-gym
(``gym_llm.integrations.skyrl``), the OpenEnv server with OpenEnv's own client (``gym_llm.integrations.openenv``),
verifiers' eval loop (``gym_llm.integrations.verifiers``, the policy behind an OpenAI-compatible endpoint) and TRL's
``environment_factory`` driven the way TRL's tool loop drives it (``gym_llm_adapters.trl.environment``).

What "the same" means for each (the table in docs/peers.md, "One episode, every library"):

* paths that carry token ids (native vector env in tokens mode, ``AsyncVectorEnv``, TorchRL) give the same prompt and
  episode token ids, the same policy mask and the same per-step rewards as the native vector env, to the id;
* text paths (SkyRL, OpenEnv, verifiers, TRL's environment_factory) carry messages, not ids: they give the same conversation,
  message for message (tool results included), and the same rewards as the native text env. Their token ids are the
  env's rendering of that conversation, which the tokens-mode runs above pin down (the native tokens run's assistant
  ids are the replies' encodings, checked here).

TRL's own tokenization, with its tool masks, is compared with the env's policy mask on real training completions in
tests/adapters/trl/test_environment_factory.py (it needs a trainer); here TRL's side is the environment object.
"""

from __future__ import annotations

import asyncio
import json
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import numpy as np
import pytest
import torch

import gym_llm  # noqa: F401  (registers the ids)
from gym_llm.envs.hashing.chain_hash import chain_hash

pytestmark = pytest.mark.xdist_group("openenv")  # shares a worker with the OpenEnv tests (OpenEnv's import is ~5 s)

SEEDS = {"gsm8k": 3, "chat": 7, "python": 3, "hashing": 3}  # chat: seed 7 draws a task with two user follow-ups
ARITH = {"source": "arithmetic"}
END = "<|im_end|>"


def policy(kind: str, messages: list[dict]) -> str:
    """The scripted policy: the reply to the conversation so far (OpenAI-form messages)."""
    turn = sum(m["role"] == "assistant" for m in messages)
    if kind == "chat":
        return f"Reply number {turn + 1}."
    question = next(m["content"] for m in messages if m["role"] == "user")
    a, b = (int(x) for x in question.split("What is ")[1].split("?")[0].split(" + "))
    if kind == "gsm8k":
        return f"{a} + {b} = {a + b}\n#### {a + b}"
    if kind == "python":  # a tool call, then the answer the tool printed
        if turn == 0:
            call = {"name": "python", "arguments": {"code": f"print({a} + {b})"}}
            return f"Let me run it.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return f"The tool printed {messages[-1]['content'].strip()}.\n#### {messages[-1]['content'].strip()}"
    raise AssertionError(kind)


@pytest.fixture(scope="module", autouse=True)
def _close_skyrl_pool():
    """SkyRL's adapter pools finished envs for the next trajectory; close them (and their sandboxes) after this file."""
    yield
    from gym_llm.integrations import skyrl

    skyrl._close_pool()


@pytest.fixture(scope="module")
def kinds() -> dict[str, tuple[str, dict]]:
    return {"gsm8k": ("LLMGSM8K-v0", ARITH), "chat": ("LLMChat-v0", {}),
            "python": ("LLMPythonTool-v0", {**ARITH, "sandbox": {"min_idle": 0, "timeout_s": 10.0}})}


def make_env(env_id: str, kwargs: dict):
    """An env for a worker process (spawned: it imports gym_llm, which registers the ids)."""
    import gym_llm  # noqa: F401

    return gym.make(env_id, **kwargs)


def plain(messages: list[dict]) -> list[tuple]:
    """(role, content, tool calls) of each message: what every text path must agree on."""
    return [(m["role"], m.get("content"), json.dumps(m.get("tool_calls"), sort_keys=True)) for m in messages]


# ---------------------------------------------------------------------------------------------------- text paths
def native_text(env_id: str, kwargs: dict, kind: str, *, task_id: int | None = None):
    """The reference: the native scalar env, seeded. Returns (task_id, messages, rewards)."""
    env = gym.make(env_id, **kwargs)
    _, info = env.reset(seed=SEEDS[kind], options=None if task_id is None else {"task_id": task_id})
    rewards, done = [], False
    while not done:
        _, reward, terminated, truncated, _ = env.step(policy(kind, [m.to_dict() for m in env.unwrapped.episode.messages]))
        rewards.append(float(reward))
        done = terminated or truncated
    messages = [m.to_dict() for m in env.unwrapped.episode.messages]
    env.close()
    return int(info["task_id"]), messages, rewards


def skyrl_path(env_id: str, kwargs: dict, kind: str, task_id: int):
    """SkyRL's generator loop over SkyRL-gym's own registry and ``make``."""
    import skyrl_gym

    from gym_llm.integrations.skyrl import PREFIX, register

    register([env_id])
    env = skyrl_gym.make(PREFIX + env_id, env_config={"env_kwargs": kwargs}, extras={"task_id": task_id, "seed": SEEDS[kind]})
    history, _ = env.init(None)
    rewards = []
    while True:
        reply = policy(kind, history)
        out = env.step(reply)
        history = history + [{"role": "assistant", "content": reply}] + out["observations"]
        rewards.append(out["reward"])
        if out["done"]:
            break
    messages = env.messages
    env.close()
    return history, messages, rewards


def openenv_path(env_id: str, kwargs: dict, kind: str, task_id: int):
    """OpenEnv's own client against ``gym_llm.integrations.openenv``'s server (in-process uvicorn)."""
    from openenv.core.generic_client import GenericEnvClient

    from gym_llm.integrations.openenv import GymLLMAction, start_server

    with start_server(env_id, kwargs) as server, GenericEnvClient(base_url=server.url).sync() as client:
        result = client.reset(seed=SEEDS[kind], task_id=task_id)
        rewards = []
        while not result.done:
            result = client.step(GymLLMAction(text=policy(kind, result.observation["messages"])))
            rewards.append(float(result.reward))
        return result.observation["messages"], rewards


def trl_path(env_id: str, kwargs: dict, kind: str, task_id: int, opening: list[dict]):
    """TRL's tool loop, as GRPOTrainer runs it with ``environment_factory``: ``reset(**row)``, the model's tool calls
    parsed to ``{name, arguments}`` and run through the instance's methods, the reward from ``environments=``."""
    from gym_llm_adapters.trl.environment import environment_factory, environment_reward

    with environment_factory(env_id, **kwargs) as factory:
        env = factory()
        env.reset(task_id=task_id, seed=SEEDS[kind], prompt=opening)
        completion = []
        while True:
            reply = policy(kind, opening + completion)
            if "<tool_call>" in reply:  # TRL's response parser: the text before the call, and the call structured
                text, rest = reply.split("<tool_call>")
                call = json.loads(rest.split("</tool_call>")[0])
                completion.append({"role": "assistant", "content": text.rstrip("\n"),
                                   "tool_calls": [{"type": "function", "function": call}]})
                completion.append({"role": "tool", "name": call["name"],
                                   "content": getattr(env, call["name"])(**call["arguments"])})
                continue
            completion.append({"role": "assistant", "content": reply})
            break
        reward = environment_reward(completions=[completion], environments=[env])[0]
        assert env.last_info["replayed_tool_calls"] == sum(m["role"] == "tool" for m in completion)
        assert env.last_info["live_tool_calls"] == env.last_info["unreplayed_tool_calls"] == 0
        return completion, reward


class ScriptedModel:
    """An OpenAI-compatible ``/v1/chat/completions`` server answering with :func:`policy` (the model name is the
    kind), for verifiers' eval client."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reply = policy(body["model"], [dict(m) for m in body["messages"]])
                data = json.dumps({"id": "scripted", "object": "chat.completion", "created": 0, "model": body["model"],
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", "content": reply}}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
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


@pytest.fixture(scope="module")
def scripted_model():
    model = ScriptedModel()
    yield model
    model.server.shutdown()


def verifiers_path(env_id: str, kwargs: dict, kind: str, task_id: int, model: ScriptedModel):
    """verifiers' eval loop (``env.serving()`` + ``env.run_episode``) on the env loaded through
    ``gym_llm.integrations.verifiers``; the model is the scripted policy behind an OpenAI-compatible endpoint."""
    from verifiers.v1.clients import EvalClientConfig, ModelContext

    from gym_llm.integrations.verifiers import load_environment

    env = load_environment(env_id, env_kwargs=kwargs, task_ids=[task_id])
    ctx = ModelContext(model=kind, client=EvalClientConfig(base_url=model.base_url, api_key_var="GYM_LLM_SCRIPTED_KEY"))

    async def run():
        async with env.serving():
            return await env.run_episode(next(iter(env.taskset)), ctx)

    episode = asyncio.run(run())
    assert episode.ok, episode.errors
    (trace,) = episode.traces
    return [m.model_dump() for m in trace.messages], trace.info["gym_llm"]["rewards"], trace.reward


@pytest.mark.parametrize("kind", ["gsm8k", "chat", "python"])
def test_text_paths_give_the_native_conversation_and_rewards(kind, kinds, scripted_model):
    env_id, kwargs = kinds[kind]
    task_id, messages, rewards = native_text(env_id, kwargs, kind)
    assert native_text(env_id, kwargs, kind, task_id=task_id) == (task_id, messages, rewards)  # seed + task id
    if kind == "python":
        assert [m["role"] for m in messages[-3:]] == ["assistant", "tool", "assistant"] and rewards[-1] == 1.0
    if kind == "chat":
        assert sum(m["role"] == "user" for m in messages) == 3

    history, skyrl_messages, skyrl_rewards = skyrl_path(env_id, kwargs, kind, task_id)
    assert skyrl_rewards == rewards and skyrl_messages == messages
    assert [(m["role"], m["content"]) for m in history] == [(m["role"], m["content"]) for m in messages]

    openenv_messages, openenv_rewards = openenv_path(env_id, kwargs, kind, task_id)
    assert openenv_rewards == rewards and plain(openenv_messages) == plain(messages)

    vf_messages, vf_rewards, vf_reward = verifiers_path(env_id, kwargs, kind, task_id, scripted_model)
    assert vf_rewards == rewards and vf_reward == pytest.approx(sum(rewards))
    assert [(m["role"], m["content"]) for m in vf_messages] == [(m["role"], m["content"]) for m in messages]

    opening = [m for m in messages if m["role"] in ("system", "user")][:2 if messages[0]["role"] == "system" else 1]
    if kind == "chat":  # TRL's environment_factory continues an episode only through tool calls (docs/trl.md)
        with pytest.raises(ValueError, match="has no tools and is multi-turn"):
            trl_path(env_id, kwargs, kind, task_id, opening)
        return
    if kind == "gsm8k":  # single turn: also TRL's reward-function path
        from gym_llm_adapters.trl.rewards import EnvReward

        reply = messages[-1]["content"]
        assert EnvReward(env_id, **kwargs)([opening], [[{"role": "assistant", "content": reply}]],
                                           task_id=[task_id]) == rewards
    completion, reward = trl_path(env_id, kwargs, kind, task_id, opening)
    assert reward == sum(rewards)
    assert [(m["role"], m["content"]) for m in completion if m["role"] == "tool"] == \
        [(m["role"], m["content"]) for m in messages if m["role"] == "tool"]
    for trl_reply, env_reply in zip([m for m in completion if m["role"] == "assistant"],
                                    [m for m in messages if m["role"] == "assistant"], strict=True):
        text, _, call = env_reply["content"].partition("<tool_call>")  # the env keeps the reply's text as written
        assert trl_reply["content"] == text.rstrip("\n")
        calls = [c["function"] for c in trl_reply.get("tool_calls") or []]
        assert calls == ([json.loads(call.split("</tool_call>")[0])] if call else [])


# --------------------------------------------------------------------------------------------------- token paths
def tokens_kwargs(kwargs: dict, tok) -> dict:
    return {**kwargs, "mode": "tokens", "tokenizer": tok, "max_seq_len": 1024, "max_action_tokens": 48,
            "record_messages": True}


def encode_reply(tok, text: str) -> tuple[np.ndarray, np.ndarray]:
    """One reply as a tokens-mode action (1, 48): its ids then the end-of-turn token, and the mask."""
    tokens = tok.encode(text + END, add_special_tokens=False)
    ids, mask = np.zeros((1, 48), dtype=np.int64), np.zeros((1, 48), dtype=np.int8)
    ids[0, :len(tokens)], mask[0, :len(tokens)] = tokens, 1
    return ids, mask


def token_record(step, reset, tok, replies: list[str]) -> dict:
    """Drive a 1-env tokens-mode vector env (``reset``/``step`` of any path) with the replies; the episode's ids,
    policy mask and rewards."""
    obs, info = reset()
    task_id = int(np.asarray(info["task_id"])[0])
    prompt = obs["input_ids"][0][obs["attention_mask"][0] == 1].tolist()
    rewards = []
    for reply in replies:
        ids, mask = encode_reply(tok, reply)
        obs, reward, terminated, truncated, info = step({"input_ids": ids, "attention_mask": mask})
        rewards.append(float(reward[0]))
        if terminated[0] or truncated[0]:
            break
    keep = obs["attention_mask"][0] == 1
    assert int(np.asarray(info["task_id"])[0]) == task_id
    return {"task_id": task_id, "prompt": prompt,
            "ids": obs["input_ids"][0][keep].tolist(), "policy_mask": np.asarray(info["policy_mask"])[0][keep].tolist(),
            "rewards": rewards}


@pytest.mark.parametrize("kind", ["gsm8k", "chat", "python"])
def test_token_paths_give_the_native_ids_masks_and_rewards(kind, kinds, tiny_tok):
    from gym_llm_adapters.torchrl import GymLLMEnv

    env_id, kwargs = kinds[kind]
    task_id, messages, rewards = native_text(env_id, kwargs, kind)
    replies = [policy(kind, messages[:i]) for i, m in enumerate(messages) if m["role"] == "assistant"]
    tk = tokens_kwargs(kwargs, tiny_tok)

    disabled = gym.vector.AutoresetMode.DISABLED  # TorchRL resets finished sub-envs itself; so do these runs
    native = gym.make_vec(env_id, num_envs=1, vectorization_mode="vector_entry_point", autoreset_mode=disabled, **tk)
    ref = token_record(native.step, lambda: native.reset(seed=SEEDS[kind]), tiny_tok, replies)
    native.close()
    assert ref["task_id"] == task_id and ref["rewards"] == rewards
    assert ref["ids"][:len(ref["prompt"])] == ref["prompt"] and sum(ref["policy_mask"]) > 0
    policy_ids = [i for i, m in zip(ref["ids"], ref["policy_mask"], strict=True) if m]
    assert policy_ids == [t for r in replies for t in tiny_tok.encode(r + END, add_special_tokens=False)]

    async_env = gym.vector.AsyncVectorEnv([partial(make_env, env_id, tk)], context="spawn", autoreset_mode=disabled)
    try:
        assert token_record(async_env.step, lambda: async_env.reset(seed=SEEDS[kind]), tiny_tok, replies) == ref
    finally:
        async_env.close()

    env = GymLLMEnv(env_id, num_envs=1, info_keys=("policy_mask", "task_id"), **tk)
    env.set_seed(SEEDS[kind])
    state = {}

    def torchrl_reset():
        state["td"] = env.reset()
        return as_numpy(state["td"]), {"task_id": state["td"]["task_id"].numpy()[:, 0]}

    def torchrl_step(action):
        td = state["td"]
        td["action", "input_ids"] = torch.from_numpy(action["input_ids"])
        td["action", "attention_mask"] = torch.from_numpy(action["attention_mask"])
        out = env.step(td)["next"]
        state["td"] = out
        info = {"task_id": out["task_id"].numpy()[:, 0], "policy_mask": out["policy_mask"].numpy()}
        return (as_numpy(out), out["reward"].numpy()[:, 0], out["terminated"].numpy()[:, 0],
                out["truncated"].numpy()[:, 0], info)

    assert token_record(torchrl_step, torchrl_reset, tiny_tok, replies) == ref
    env.close()


def as_numpy(td) -> dict:
    return {"input_ids": td["input_ids"].numpy(), "attention_mask": td["attention_mask"].numpy()}


def test_hashing_chains_and_hashes_are_the_same_on_every_path(tiny_tok):
    """The hashing env's action is one token id: the text protocols (SkyRL, OpenEnv, TRL) cannot carry it."""
    from gym_llm_adapters.torchrl import GymLLMEnv

    kwargs = {"tokenizer": tiny_tok, "max_seq_len": 64, "max_new_tokens": 5}
    tokens = [5, 9, 11, 13, 17]

    def record(reset, step) -> list:
        obs, _ = reset()
        ids, mask = np.atleast_2d(obs["input_ids"]), np.atleast_2d(obs["attention_mask"])  # the scalar env's: (L,)
        chain = ids[0][mask[0] == 1].tolist()
        out = [(int(np.asarray(obs["hash"]).reshape(-1)[0]), None)]
        for token in tokens:
            obs, reward, terminated, truncated, _ = step(token)
            chain.append(token)
            out.append((int(np.asarray(obs["hash"]).reshape(-1)[0]), float(np.asarray(reward).reshape(-1)[0])))
            assert out[-1][0] == chain_hash(chain)
        assert bool(np.asarray(truncated).reshape(-1)[0] or np.asarray(terminated).reshape(-1)[0])
        return out

    single = gym.make("LLMHashing-v0", **kwargs)
    ref = record(lambda: single.reset(seed=SEEDS["hashing"]), lambda t: single.step(t))
    native = gym.make_vec("LLMHashing-v0", num_envs=1, vectorization_mode="vector_entry_point",
                          autoreset_mode=gym.vector.AutoresetMode.DISABLED, **kwargs)  # its default is SAME_STEP
    assert record(lambda: native.reset(seed=SEEDS["hashing"]), lambda t: native.step(np.array([t]))) == ref
    async_env = gym.vector.AsyncVectorEnv([partial(make_env, "LLMHashing-v0", kwargs)], context="spawn")
    try:
        assert record(lambda: async_env.reset(seed=SEEDS["hashing"]), lambda t: async_env.step(np.array([t]))) == ref
    finally:
        async_env.close()

    env = GymLLMEnv("LLMHashing-v0", num_envs=1, **kwargs)
    env.set_seed(SEEDS["hashing"])
    state = {"td": env.reset()}

    def torchrl_obs(td) -> dict:
        return {"hash": td["hash"].numpy().view(np.uint64)[:, 0], "input_ids": td["input_ids"].numpy(),
                "attention_mask": td["attention_mask"].numpy()}

    def torchrl_step(token):
        state["td"]["action"] = torch.tensor([token])
        out = env.step(state["td"])["next"]
        state["td"] = out
        return torchrl_obs(out), out["reward"].numpy(), out["terminated"].numpy(), out["truncated"].numpy(), {}

    assert record(lambda: (torchrl_obs(state["td"]), {}), torchrl_step) == ref
    env.close()
    single.close()
    native.close()
