"""gym_llm envs as SkyRL-gym environments (``skyrl_gym.Env``), registered in SkyRL's registry.

SkyRL's generator owns the conversation: it calls ``env.init(prompt)`` for the messages the model starts from,
renders them with the model's chat template, samples a reply, and calls ``env.step(reply_text)``, which returns
the *new* messages to append (tool results, the next user turn), the reward and ``done``. One env instance serves
one trajectory; SkyRL builds it with ``skyrl_gym.make(env_class, env_config=..., extras=row)`` where ``row`` is the
dataset row.

:class:`SkyRLEnv` runs one gym_llm episode (text mode) behind that contract:

- ``init`` resets the gym_llm env to the row's task (``extras["task_id"]``, an index into the env's task source;
  without one, the next task of a stream seeded by ``extras["seed"]``) and returns the env's own prompt messages
  (system prompt, task, tool instructions) in OpenAI form — the prompt SkyRL passes in is ignored, so the dataset
  only needs the task ids (:func:`skyrl_dataset` builds one, with the same prompts for display);
- ``step`` feeds the reply to ``env.step`` and returns the messages the env added after the assistant turn, the
  env's reward, ``done = terminated or truncated``, and the scalar ``info`` values as ``metadata``.

gym_llm envs are built once per configuration and pooled: ``close`` returns the env to its pool, the next ``make``
with the same configuration reuses it (a GSM8K env loads its data once, a Python tool env keeps its sandbox pool).

Configuration (SkyRL's ``env_config``, e.g. ``environment.skyrl_gym.gym_llm`` in a SkyRL config): ``env_id`` (a
gym_llm id) and ``env_kwargs`` (its arguments). :func:`register` adds every gym_llm id to SkyRL's registry as
``"gym_llm/<id>"`` with ``env_id`` bound, so ``env_class: gym_llm/LLMGSM8K-v0`` needs only ``env_kwargs``.

Needs ``skyrl-gym`` (``pip install 'gym-llm[skyrl]'``; tested with 0.4.0). Imports no torch.
"""

from __future__ import annotations

import atexit
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register as _skyrl_register
from skyrl_gym.envs.registration import registry as _skyrl_registry

from gym_llm.core.forksafe import ForkSafeLock

__all__ = ["SkyRLEnv", "register", "skyrl_dataset", "PREFIX"]

PREFIX = "gym_llm/"

_pool: dict[tuple, list[gym.Env]] = {}
_pool_lock = ForkSafeLock()


def _key(env_id: str, kwargs: Mapping[str, Any]) -> tuple | None:
    """The pool key of a configuration; None (no pooling: the env is closed with its SkyRLEnv) when its arguments
    have no stable text form (objects such as a tokenizer)."""
    text = repr(sorted(kwargs.items()))
    return None if " at 0x" in text else (env_id, text)


def _plain(value: Any) -> Any:
    """OmegaConf containers (SkyRL's configs) and numpy scalars -> plain Python."""
    if hasattr(value, "items") and not isinstance(value, dict):
        value = dict(value.items())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not isinstance(value, str):
        return [_plain(v) for v in value]
    return value


@atexit.register
def _close_pool() -> None:
    """Close the pooled gym_llm envs (their sandboxes, browsers, worker processes) when the interpreter exits."""
    with _pool_lock:
        envs = [env for idle in _pool.values() for env in idle]
        _pool.clear()
    for env in envs:
        try:
            env.close()
        except Exception:  # noqa: BLE001  (exiting: one env's failure must not keep the others open)
            pass


class SkyRLEnv(BaseTextEnv):
    """One gym_llm text-mode episode as a SkyRL-gym env (see the module docstring).

    Args:
        env_config: ``{"env_id": ..., "env_kwargs": {...}}`` (a dict or OmegaConf config).
        extras: the dataset row: ``task_id`` (int) and/or ``seed`` (int); other keys are ignored.
        env_id: the gym_llm id, when not in ``env_config`` (what :func:`register` binds).
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None, *, env_id: str | None = None):
        super().__init__()
        config = _plain(env_config) or {}
        extras = _plain(extras) or {}
        env_id = env_id or config.get("env_id")
        if not env_id:
            raise ValueError("SkyRLEnv needs a gym_llm env id: env_config={'env_id': 'LLMGSM8K-v0', 'env_kwargs': "
                             "{...}}, or register() and use env_class 'gym_llm/<id>'.")
        kwargs = dict(config.get("env_kwargs") or {})
        if kwargs.get("mode", "text") != "text":
            raise ValueError(f"SkyRL speaks text (messages in, reply text out); got mode={kwargs['mode']!r}. Drop "
                             "'mode' from env_kwargs: SkyRL's generator tokenizes with the model's chat template.")
        self.env_id, self.env_kwargs = env_id, kwargs
        self.task_id = extras.get("task_id")
        self.seed = extras.get("seed")
        for name, value in (("task_id", self.task_id), ("seed", self.seed)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                raise TypeError(f"extras[{name!r}] must be an int, got {type(value).__name__} {value!r}.")
        self._pool_key = _key(env_id, kwargs)
        with _pool_lock:
            idle = _pool.get(self._pool_key) if self._pool_key is not None else None
            self.env = idle.pop() if idle else None
        if self.env is None:
            self.env = gym.make(env_id, **kwargs)
        chat = getattr(self.env.unwrapped, "parts", None)
        chat = getattr(chat, "extra", {}).get("chat")  # chat-style envs' settings (max_turns)
        self.max_turns = int(getattr(getattr(chat, "config", None), "max_turns", 1) or 1)
        self._messages_seen = 0
        self._closed = False

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The whole conversation so far, in OpenAI form."""
        return [m.to_dict() for m in self.env.unwrapped.episode.messages]

    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        options = {"task_id": int(self.task_id)} if self.task_id is not None else None
        _, info = self.env.reset(seed=None if self.seed is None else int(self.seed), options=options)
        messages = self.messages
        self._messages_seen = len(messages)
        self.turns = 0
        return messages, {"task_id": int(info.get("task_id", -1))}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if not isinstance(action, str):
            raise TypeError(f"SkyRLEnv.step expects the reply text (str), got {type(action).__name__}.")
        _, reward, terminated, truncated, info = self.env.step(action)
        self.turns += 1
        messages = self.messages
        new = messages[self._messages_seen + 1:]  # after the assistant turn just taken
        self._messages_seen = len(messages)
        metadata = {k: v.item() if isinstance(v, np.generic) else v for k, v in info.items()
                    if isinstance(v, (bool, int, float, str, np.generic))}
        return BaseTextEnvStepOutput(observations=new, reward=float(reward), done=bool(terminated or truncated),
                                     metadata=metadata, postprocessed_action=None)

    def close(self) -> None:
        """Returns the gym_llm env to the pool for the next trajectory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._pool_key is None:
            self.env.close()
            return
        with _pool_lock:
            _pool.setdefault(self._pool_key, []).append(self.env)


def register(env_ids: list[str] | None = None) -> list[str]:
    """Register gym_llm ids in SkyRL's registry as ``"gym_llm/<id>"`` (all registered ids by default); returns the
    SkyRL ids. Idempotent."""
    import gym_llm  # noqa: F401  (registers the ids, plugins' included)
    from gym_llm.registration import registered_envs

    ids = env_ids if env_ids is not None else [info.id for info in registered_envs()]
    out = []
    for env_id in ids:
        name = PREFIX + env_id
        if name not in _skyrl_registry:
            _skyrl_register(id=name, entry_point=f"{__name__}:SkyRLEnv", kwargs={"env_id": env_id})
        out.append(name)
    return out


def skyrl_dataset(env_id: str, task_ids: list[int], env_kwargs: Mapping[str, Any] | None = None) -> list[dict]:
    """Rows for SkyRL's prompt dataset: ``{"prompt": messages, "env_class": "gym_llm/<id>", "task_id": i}`` — the
    prompt is what :meth:`SkyRLEnv.init` will return for that task (SkyRL shows and filters by it)."""
    env = SkyRLEnv({"env_id": env_id, "env_kwargs": dict(env_kwargs or {})})
    rows = []
    try:
        for task_id in task_ids:
            env.task_id = int(task_id)
            prompt, _ = env.init(None)
            rows.append({"prompt": prompt, "env_class": PREFIX + env_id, "task_id": int(task_id)})
    finally:
        env.close()
    return rows
