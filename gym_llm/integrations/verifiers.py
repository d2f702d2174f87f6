"""gym_llm envs as verifiers environments (verifiers 0.4.0, its ``verifiers.v1`` API).

verifiers loads an environment from a *taskset id*: the name of an installed package whose ``__all__`` exports one
``Taskset`` subclass, and optionally the ``Env`` that runs its tasks and the ``Harness`` its agents use by default.
gym-llm ships that package as ``gym_llm_verifiers`` (a re-export of this module), so every registered gym_llm env is
one taskset id plus the env id::

    vf-eval gym_llm_verifiers --env.taskset.env-id LLMIFEval-v0 \\
        --env.taskset.env-kwargs '{"data_files": "ifeval/input_data.jsonl"}' -m MODEL -n 10

or in Python :func:`load_environment` ``("LLMIFEval-v0", env_kwargs={...})``, the same ``vf.Env`` as
``vf.load_environment(vf.resolve_env_config({"taskset": {"id": "gym_llm_verifiers", "env_id": ...}}))``.

How one verifiers episode is one gym_llm episode:

- :class:`GymLLMTaskset` yields one task per task of the gym_llm env's source (``task_ids`` picks some): its
  ``task_id``, and as its prompt the messages ``env.reset(options={"task_id": i})`` starts from (the system
  message as ``system_prompt``, the rest as ``prompt``). A GSM8K task's answer never enters the task data: the
  gym_llm env scores replies itself.
- :class:`GymLLMEnv` plays the gym_llm env as the agent's *user* (verifiers' ``Agent.interaction``): it resets the
  env to the task, takes the agent's reply, feeds it to ``env.step``, and sends back the messages the env added
  after it — a Python tool's output (a ``tool`` message), a scripted user's next turn — until the env's episode
  ends (terminated or truncated) or the agent's own limits stop it. The sum of the env's step rewards is the
  trace's reward ``gym_llm_reward`` (verifiers' rubric: ``trace.reward``); the last step's numeric ``info``
  entries (``correct``, IFEval's ``prompt_strict``...) become trace metrics; ``trace.info["gym_llm"]`` holds
  the per-step rewards and how the episode ended.
- :class:`GymLLMHarness`, the taskset's default harness, is the policy side: one chat-completion request per turn
  with the conversation so far, made in-process through the rollout's interception endpoint (so verifiers
  records the turn, enforces limits and forwards it to the model client). gym_llm envs parse tool calls out of
  the reply text themselves (fenced code, ``<tool_call>`` JSON), so the harness offers the model no tools.
  ``--env.agent.harness.id null`` runs verifiers' own chat program instead (it installs itself with uv).

The seat is ``agent`` (as in verifiers' single-agent env) on a local ``subprocess`` runtime: the harness runs no
program, and the gym_llm env runs its tools in its own sandbox. Envs are text mode only (verifiers' model
clients own tokenization). gym_llm envs are built once per configuration and pooled across episodes.

Needs ``verifiers==0.4.0`` (``pip install 'gym-llm[verifiers]'``). Imports no torch.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from gym_llm.core.forksafe import ForkSafeLock

try:
    import verifiers.v1 as vf
    from pydantic import Field
    from verifiers.v1.runtimes import ProgramResult
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "gym_llm.integrations.verifiers needs verifiers 0.4.0 (its verifiers.v1 API): pip install "
        f"'gym-llm[verifiers]' (or pip install verifiers==0.4.0). Import failed with: {e}"
    ) from e

__all__ = [
    "TASKSET_ID",
    "GymLLMData",
    "GymLLMEnv",
    "GymLLMEnvConfig",
    "GymLLMHarness",
    "GymLLMHarnessConfig",
    "GymLLMTask",
    "GymLLMTaskset",
    "GymLLMTasksetConfig",
    "load_environment",
]

logger = logging.getLogger(__name__)

TASKSET_ID = "gym_llm_verifiers"
"""The verifiers taskset id of every gym_llm env (the package ``gym_llm_verifiers``); the env is picked by
``env_id`` in the taskset's config."""

REWARD_NAME = "gym_llm_reward"
"""The name of the reward :class:`GymLLMEnv` records on each trace: the sum of the gym_llm env's step rewards."""


# --- pooled gym_llm envs -------------------------------------------------------------------------------------------

_pool: dict[str, list[gym.Env]] = {}
_pool_lock = ForkSafeLock()


def _pool_key(env_id: str, env_kwargs: Mapping[str, Any]) -> str:
    return json.dumps([env_id, env_kwargs], sort_keys=True)


def _acquire(env_id: str, env_kwargs: Mapping[str, Any]) -> gym.Env:
    """An idle env of this configuration, or a new one (blocking: call it off the event loop)."""
    with _pool_lock:
        idle = _pool.get(_pool_key(env_id, env_kwargs))
        env = idle.pop() if idle else None
    return env if env is not None else gym.make(env_id, **env_kwargs)


def _release(env_id: str, env_kwargs: Mapping[str, Any], env: gym.Env) -> None:
    with _pool_lock:
        _pool.setdefault(_pool_key(env_id, env_kwargs), []).append(env)


@atexit.register
def _close_pool() -> None:
    """Close the pooled envs (their sandboxes and worker processes) when the interpreter exits."""
    with _pool_lock:
        envs = [env for idle in _pool.values() for env in idle]
        _pool.clear()
    for env in envs:
        try:
            env.close()
        except Exception:  # exiting: one env's failure must not keep the others open
            logger.debug("closing a pooled gym_llm env at exit failed", exc_info=True)


def _messages(env: gym.Env) -> list[dict[str, Any]]:
    """The env's conversation so far, in OpenAI form."""
    return [m.to_dict() for m in env.unwrapped.episode.messages]


def _to_verifiers(messages: Sequence[Mapping[str, Any]], start: int = 0) -> list[Any]:
    """gym_llm's OpenAI-form messages (the episode's, from index ``start`` on) as verifiers' typed messages.

    A gym_llm tool message answers a call parsed out of the reply text, which verifiers' trace holds as plain
    assistant text, so it may have no ``tool_call_id``; verifiers requires one, so such a message gets
    ``"gym_llm-tool-<n>"``, ``n`` its index in the episode's messages (unique within the episode)."""
    out = []
    for position, m in enumerate(messages, start):
        role, content = m["role"], m["content"]
        if role == "system":
            out.append(vf.SystemMessage(content=content))
        elif role == "user":
            out.append(vf.UserMessage(content=content))
        elif role == "tool":
            call_id = m.get("tool_call_id") or f"gym_llm-tool-{position}"
            out.append(vf.ToolMessage(content=content, tool_call_id=call_id, name=m.get("name")))
        else:
            out.append(vf.AssistantMessage(content=content))
    return out


# --- the taskset ---------------------------------------------------------------------------------------------------


def _registered_ids() -> list[str]:
    import gym_llm  # noqa: F401  (registers the ids, plugins' included)
    from gym_llm.registration import registered_envs

    return [info.id for info in registered_envs()]


class GymLLMTasksetConfig(vf.TasksetConfig):
    """The taskset's knobs (``--env.taskset.*``)."""

    env_id: str = ""
    """The gym_llm env id, e.g. ``LLMGSM8K-v0`` (``--env.taskset.env-id``)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """The env's arguments (``gym.make(env_id, **env_kwargs)``), JSON values only; text mode."""
    task_ids: list[int] | None = None
    """Which tasks of the env's source to yield, by index; None yields every task, in order."""


def _check_config(config: GymLLMTasksetConfig) -> None:
    """Raise ``ValueError`` naming the field, what it takes and the fix. Run when the taskset is built, not when its
    config is parsed: verifiers' CLI parses a partial config (the id alone) before the flags are applied."""
    ids = _registered_ids()
    if config.env_id not in ids:
        raise ValueError(
            f"taskset.env_id: expected a registered gym_llm env id, one of {ids}; got {config.env_id!r}. Set it with "
            "--env.taskset.env-id LLMGSM8K-v0 (Python: load_environment('LLMGSM8K-v0', env_kwargs={...}))."
        )
    if config.env_kwargs.get("mode", "text") != "text":
        raise ValueError(
            f"taskset.env_kwargs: verifiers speaks text (messages in, reply text out); got mode="
            f"{config.env_kwargs['mode']!r}. Drop 'mode': verifiers' model client tokenizes."
        )
    try:
        json.dumps(config.env_kwargs)
    except TypeError as e:
        raise ValueError(
            f"taskset.env_kwargs: expected JSON values (they travel in each task's data); got {config.env_kwargs!r} "
            f"({e}). Pass paths, numbers and strings; a chat env's reward goes in as a verifiers reward function "
            "(--env.taskset.task.rewards.<name>.fn pkg.module:fn) instead of reward_fn."
        ) from None
    if config.task_ids is not None and any(i < 0 for i in config.task_ids):
        raise ValueError(f"taskset.task_ids: expected indices >= 0 into the env's task source, got {config.task_ids}.")


class GymLLMData(vf.TaskData):
    """One gym_llm task: which env, its arguments, and the task's index in the env's source."""

    env_id: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    task_id: int


class GymLLMTask(vf.Task[GymLLMData]):
    """A gym_llm task; :class:`GymLLMEnv` scores it (the gym_llm env's rewards), so it declares no ``@vf.reward``."""

    @property
    def key(self) -> str:
        """``"<env_id>#<task_id>"``: stable across runs and task selections."""
        return f"{self.data.env_id}#{self.data.task_id}"


class GymLLMTaskset(vf.Taskset[GymLLMTask, GymLLMTasksetConfig]):
    """The tasks of one gym_llm env's source (see the module docstring); iterating resets a pooled env per task to
    read its prompt."""

    def __init__(self, config: GymLLMTasksetConfig) -> None:
        _check_config(config)
        super().__init__(config)

    def load(self) -> Iterator[GymLLMTask]:
        config = self.config
        env = _acquire(config.env_id, config.env_kwargs)
        try:
            if not hasattr(env.unwrapped.episode, "messages"):
                raise ValueError(
                    f"taskset.env_id: expected a chat env (one whose episode is a list of messages: LLMChat-v0, "
                    f"LLMGSM8K-v0, LLMIFEval-v0, LLMPythonTool-v0...); got {config.env_id}, whose actions are raw "
                    "tokens or text with no chat turns, and verifiers' policies answer chat requests. Roll it out "
                    "with gym_llm's collector or TorchRL instead (docs/peers.md)."
                )
            num_tasks = len(env.unwrapped.parts.tasks)
            task_ids = config.task_ids if config.task_ids is not None else range(num_tasks)
            for task_id in task_ids:
                if task_id >= num_tasks:
                    raise ValueError(
                        f"task_ids: {config.env_id}'s task source has {num_tasks} tasks (ids 0..{num_tasks - 1}); "
                        f"got {task_id}. Pick ids below {num_tasks} or point env_kwargs at a larger source."
                    )
                env.reset(options={"task_id": int(task_id)})
                system, prompt = _split_prompt(_messages(env))
                yield GymLLMTask(
                    GymLLMData(name=f"{config.env_id}#{task_id}", env_id=config.env_id,
                               env_kwargs=config.env_kwargs, task_id=int(task_id), system_prompt=system,
                               prompt=_to_verifiers(prompt)),
                    config.task,
                )
        finally:
            _release(config.env_id, config.env_kwargs, env)


def _split_prompt(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """(the leading system message's text or None, the other messages)."""
    if messages and messages[0]["role"] == "system":
        return messages[0]["content"], messages[1:]
    return None, messages


# --- the harness ---------------------------------------------------------------------------------------------------


class GymLLMHarnessConfig(vf.HarnessConfig):
    """:class:`GymLLMHarness` has no knobs of its own (sampling is the run's ``--sampling.*``)."""


class GymLLMHarness(vf.Harness[GymLLMHarnessConfig]):
    """One chat-completion request per segment, in-process, through the rollout's interception endpoint.

    The request carries the conversation so far (system prompt first) and no tools; the reply is the segment's
    one assistant message. A failed request fails the segment (verifiers records it on the trace)."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: vf.ModelContext, trace: vf.Trace, runtime: vf.Runtime, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: vf.TaskData,
                     tool_interception_url: str | None = None) -> ProgramResult:
        """Sends ``data``'s conversation to ``endpoint`` (authenticated by ``secret``) and returns a success result;
        verifiers' interception records the reply on ``trace``. ``runtime`` and ``mcp_urls`` are unused."""
        from openai import AsyncOpenAI

        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages += [m.model_dump(exclude_none=True) for m in prompt]
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        return ProgramResult(exit_code=0, stdout="", stderr="")


# --- the env -------------------------------------------------------------------------------------------------------


class GymLLMEnvConfig(vf.EnvConfig):
    """:class:`GymLLMEnv`'s config: the one ``agent`` seat (``--env.agent.*``), on a local runtime by default."""

    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The policy's seat. The default harness runs in-process and executes nothing, so the local ``subprocess``
    runtime is enough; ``--env.agent.max-turns`` caps the episode's replies."""


class GymLLMEnv(vf.Env[GymLLMEnvConfig]):
    """Runs each task as one gym_llm episode, the gym_llm env playing the agent's user (see the module docstring)."""

    async def run(self, task: GymLLMTask, agents: vf.Agents) -> None:
        data = task.data
        env = await asyncio.to_thread(_acquire, data.env_id, data.env_kwargs)
        try:
            await self._play(env, task, agents)
        finally:
            _release(data.env_id, data.env_kwargs, env)

    async def _play(self, env: gym.Env, task: GymLLMTask, agents: vf.Agents) -> None:
        data = task.data
        await asyncio.to_thread(env.reset, options={"task_id": data.task_id})
        messages = _messages(env)
        prompt = _to_verifiers(_split_prompt(messages)[1])
        if prompt != data.prompt:  # the system prompt may differ on purpose: a taskset-level override (GEPA)
            logger.warning("%s: the env's prompt for task %d differs from the task's data (was the source changed "
                           "since the taskset loaded?); the agent sees the env's.", data.env_id, data.task_id)
            task = task.with_data(prompt=prompt)
        rewards: list[float] = []
        info: dict[str, Any] = {}
        ended = "agent_stopped"  # the agent's limits (max_turns, tokens) or a failed turn ended the exchange
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                _, reward, terminated, truncated, info = await asyncio.to_thread(env.step, _reply(segment))
                rewards.append(float(reward))
                if terminated or truncated:
                    ended = "terminated" if terminated else "truncated"
                    break
                after = _messages(env)
                start = len(messages) + 1  # what the env added after the reply
                new, messages = after[start:], after
                segment = await interaction.turn(_to_verifiers(new, start))
        trace = interaction.trace
        trace.record_reward(REWARD_NAME, sum(rewards))
        trace.record_metrics({k: float(v) for k, v in info.items() if _is_number(v) and k not in _IDENTIFIERS})
        trace.info["gym_llm"] = {"env_id": data.env_id, "task_id": data.task_id, "rewards": rewards, "ended": ended}


_IDENTIFIERS = ("task_id", "group_id", "round", "key")  # numeric info entries that are ids, not measurements


def _reply(segment: Any) -> str:
    """The segment's last assistant text, unstripped (``Segment.last_reply`` strips; the env scores the raw text)."""
    for message in reversed(segment.messages):
        if isinstance(message, vf.AssistantMessage):
            return message.content or ""
    return ""


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating))


# --- loading -------------------------------------------------------------------------------------------------------


def load_environment(env_id: str, *, env_kwargs: Mapping[str, Any] | None = None,
                     task_ids: Sequence[int] | None = None, taskset: Mapping[str, Any] | None = None,
                     **env_config: Any) -> GymLLMEnv:
    """The verifiers ``Env`` running gym_llm's ``env_id``: the one ``vf-eval gym_llm_verifiers --env.taskset.env-id
    ...`` builds.

    Args:
        env_id: a registered gym_llm id (``LLMGSM8K-v0``, ``LLMIFEval-v0``, ``LLMChat-v0``, ``LLMPythonTool-v0``...).
        env_kwargs: the env's arguments (JSON values; text mode).
        task_ids: the tasks to yield (indices into the env's source); all by default.
        taskset: verifiers' other taskset fields, e.g. ``{"task": {"rewards": {"polite": {"fn": "pkg.mod:fn"}}}}``
            (a reward function added to the env's) or ``{"system_prompt": "prompt.txt"}``.
        **env_config: verifiers' other ``EnvConfig`` fields, e.g. ``agent={"max_turns": 4}``.

    Raises:
        ValueError: an unknown ``env_id``, ``mode="tokens"``, non-JSON ``env_kwargs`` or a negative task id.
    """
    fields = {**dict(taskset or {}), "id": TASKSET_ID, "env_id": env_id, "env_kwargs": dict(env_kwargs or {}),
              "task_ids": None if task_ids is None else [int(i) for i in task_ids]}
    return vf.load_environment(vf.resolve_env_config({**env_config, "taskset": fields}))
