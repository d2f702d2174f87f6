"""What the Ray actors build, and the errors the Ray collector raises. No Ray import here.

Actors receive *specs*, not live objects: an env worker builds its vector env from an :class:`EnvSpec`
(an env id + ``gym.make_vec`` arguments, or a factory), an engine actor builds its engine from an
:class:`EngineSpec` (``"hf"``, ``"vllm"``, ``"vllm_server"`` + constructor arguments, or a factory). Specs are
pickled to the actors (Ray's cloudpickle), so arguments such as tokenizers and reward functions travel
with them; factories and reward functions defined in a script's ``__main__`` are pickled by value.
"""

from __future__ import annotations

from gym_llm_adapters.faults import CollectorBrokenError

import importlib
from typing import Any, Callable

__all__ = ["EnvSpec", "EngineSpec", "EngineUnavailableError", "EngineCallError", "EngineDiedError",
           "EnvWorkerDiedError", "require_ray"]

_ENGINE_KINDS = {
    "hf": ("gym_llm_adapters.engines.hf", "HFEngine"),
    "vllm": ("gym_llm_adapters.engines.vllm", "VLLMEngine"),
    "vllm_server": ("gym_llm_adapters.engines.server", "VLLMServerEngine"),
}


def require_ray() -> Any:
    """``import ray``, or an ``ImportError`` naming the extra to install."""
    try:
        import ray
    except ImportError as e:  # pragma: no cover - ray is installed wherever these tests run
        raise ImportError("The Ray collector needs Ray: pip install 'gym-llm[ray]'.") from e
    return ray


class EnvSpec:
    """How an env worker builds its vector env.

    ``EnvSpec("LLMGSM8K-v0", num_envs=64, group_size=8, mode="tokens", tokenizer=tok, data_files=...)`` runs
    ``gym.make_vec(env_id, num_envs=64, group_size=8, ...)`` in the worker (gym_llm ids use their native vector
    env); ``EnvSpec(factory, **kwargs)`` calls ``factory(**kwargs)``, which must return a gymnasium
    ``VectorEnv``. Every worker builds the same env; each gets its own seeds and sub-env / group-id range.

    Args:
        env: a registered env id, or a callable returning a vector env.
        num_envs: sub-envs per worker (passed to ``gym.make_vec``; for a factory only when given).
        **kwargs: the remaining ``gym.make_vec`` / factory arguments.
    """

    def __init__(self, env: str | Callable[..., Any], *, num_envs: int | None = None, **kwargs: Any):
        if not (isinstance(env, str) or callable(env)):
            raise TypeError(
                f"EnvSpec needs an env id (str) or a factory returning a VectorEnv, got {type(env).__name__}.")
        if num_envs is not None and (isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1):
            raise ValueError(f"EnvSpec num_envs must be an int >= 1, got {num_envs!r}.")
        self.env, self.num_envs, self.kwargs = env, num_envs, dict(kwargs)

    def build(self) -> Any:
        """The vector env (called inside the worker)."""
        from gymnasium.vector import VectorEnv

        import gym_llm  # noqa: F401  (registers the gym_llm ids, for ids and for factories that use them)

        if isinstance(self.env, str):
            import gymnasium as gym

            env = gym.make_vec(self.env, num_envs=1 if self.num_envs is None else self.num_envs, **self.kwargs)
        else:
            kwargs = dict(self.kwargs) if self.num_envs is None else {"num_envs": self.num_envs, **self.kwargs}
            env = self.env(**kwargs)
        if not isinstance(env, VectorEnv):
            raise TypeError(f"The EnvSpec factory must return a gymnasium VectorEnv, got {type(env).__name__}.")
        return env

    def __repr__(self) -> str:
        name = self.env if isinstance(self.env, str) else getattr(self.env, "__qualname__", repr(self.env))
        return f"EnvSpec({name!r}, num_envs={self.num_envs}, kwargs={sorted(self.kwargs)})"


class EngineSpec:
    """How an engine actor builds its engine.

    ``EngineSpec("vllm", path, dtype="bfloat16")`` builds ``VLLMEngine(path, dtype="bfloat16", version=v)``;
    ``"hf"`` builds :class:`~gym_llm_adapters.engines.HFEngine`, ``"vllm_server"``
    :class:`~gym_llm_adapters.engines.VLLMServerEngine`; a callable is called as ``factory(*args, version=v,
    **kwargs)`` and must return an :class:`~gym_llm_adapters.engines.Engine`. ``version`` is set by the
    engine group (a restarted engine resumes at the group's version), and so is ``adapter=`` (the LoRA adapter
    served, passed only when there is one). For LoRA give the engine's ``lora_rank=R`` here:
    ``EngineSpec("vllm", path, lora_rank=16, ...)``.

    Args:
        kind: ``"hf"``, ``"vllm"``, ``"vllm_server"`` or a factory.
        *args, **kwargs: the engine constructor's arguments.
        thread_safe: the engine may run calls from several threads at once (an engine actor otherwise runs
            one ``generate`` / ``logprobs`` / ``load_weights`` at a time). True for engines that only wait on
            a remote server, False (the default) for in-process vLLM and transformers.
    """

    def __init__(self, kind: str | Callable[..., Any], *args: Any, thread_safe: bool = False, **kwargs: Any):
        if isinstance(kind, str) and kind not in _ENGINE_KINDS:
            raise ValueError(f"EngineSpec kind must be one of {sorted(_ENGINE_KINDS)} or a factory, got {kind!r}.")
        if not (isinstance(kind, str) or callable(kind)):
            raise TypeError(f"EngineSpec kind must be a str or a callable, got {type(kind).__name__}.")
        for own in ("version", "adapter"):
            if own in kwargs:
                raise ValueError(f"EngineSpec sets the engine's {own} itself; pass {own}= to EngineGroup instead.")
        self.kind, self.args, self.kwargs, self.thread_safe = kind, tuple(args), dict(kwargs), bool(thread_safe)

    def build(self, version: int = 0, adapter: Any = None) -> Any:
        """The engine, at ``version`` (called inside the engine actor); serving the LoRA ``adapter`` (an
        :class:`~gym_llm_adapters.lora.Adapter` at that version) from the start when given."""
        if isinstance(self.kind, str):
            module, name = _ENGINE_KINDS[self.kind]
            factory = getattr(importlib.import_module(module), name)
        else:
            factory = self.kind
        extra = {} if adapter is None else {"adapter": adapter}  # factories without LoRA need not take it
        engine = factory(*self.args, version=version, **extra, **self.kwargs)
        for member in ("generate", "logprobs", "load_weights", "version"):
            if not hasattr(engine, member):
                raise TypeError(f"The engine built by {self!r} has no `{member}`; it must implement the Engine protocol.")
        return engine

    def __repr__(self) -> str:
        kind = self.kind if isinstance(self.kind, str) else getattr(self.kind, "__qualname__", repr(self.kind))
        return (f"EngineSpec({kind!r}, args={self.args!r:.60}, kwargs={sorted(self.kwargs)}, "
                f"thread_safe={self.thread_safe})")


class EngineUnavailableError(RuntimeError):
    """An engine actor died (or cannot be reached) during a call. The caller's state is untouched; the
    engine group restarts the actor per its policy and the call is retried."""

    def __init__(self, engine_index: int, actor_id: str, detail: str):
        super().__init__(engine_index, actor_id, detail)

    @property
    def engine_index(self) -> int:
        return int(self.args[0])

    @property
    def actor_id(self) -> str:
        return str(self.args[1])

    def __str__(self) -> str:
        return f"Engine actor {self.engine_index} ({self.actor_id[:12]}) is unavailable: {self.args[2]}"


class EngineCallError(RuntimeError):
    """An engine call raised inside a live engine actor (bad input, a model error). Nothing was recorded; fix
    the cause and call ``next_batch()`` again."""


class EngineDiedError(RuntimeError):
    """An engine actor died and may not be restarted (its ``max_restarts`` is used up, or its weights cannot
    be restored)."""


class EnvWorkerDiedError(CollectorBrokenError):
    """An env worker failed more often than ``max_worker_restarts`` allows."""
