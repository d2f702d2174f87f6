"""The scalar Gymnasium env that drives one :class:`~gym_llm.core.episode.Episode`."""

from __future__ import annotations

import copy
import inspect
import sys
from typing import Any, Callable

import gymnasium as gym
from gymnasium.error import ResetNeeded

from gym_llm.core.episode import EnvParts, ForkError, make_all, resolve_reset_task
from gym_llm.core.pickling import ConstructorPickle
from gym_llm.core.tasks import TASK_SEED_BOUND, TaskStream
from gym_llm.core.vector import VECTOR_ARGUMENTS, LLMVectorEnv

__all__ = ["LLMEnv", "TASK_SEED_BOUND", "VECTOR_ARGUMENTS", "vector_name"]


class LLMEnv(ConstructorPickle, gym.Env):
    """A Gymnasium env over one LLM episode at a time (see the concrete envs for their docs).

    Seeding: ``reset(seed=s)`` seeds ``self.np_random`` and draws the task-stream seed from it, so the
    task sequence depends on ``s`` only. ``reset()`` without a seed moves on to the next round (the next
    task in the stream). ``reset(options={"task_id": i})`` runs task ``i`` of the source instead.

    ``info`` always holds ``task_id`` (index into the task source) and ``round`` (episode number
    since the last seeded reset).

    Pickling: an env pickles as its class and constructor arguments and unpickles by being made again
    (:mod:`gym_llm.core.pickling`); the copy needs ``reset()``.

    Forking: :meth:`fork` copies the env at its current step into siblings that share the past and diverge
    from there (tree search, "retry from turn k"); see ``docs/branching.md``.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    Vector: type | None = None
    """The env's native vector env class (a :class:`~gym_llm.core.vector.LLMVectorEnv`), for envs declared with
    ``build=`` (see :meth:`__init_subclass__`)."""

    def __init_subclass__(cls, build: Callable[..., Any] | None = None, **kwargs: Any) -> None:
        """``class MyEnv(LLMEnv, build=build_my_env): ...`` declares an env by the function that builds its
        :class:`~gym_llm.core.episode.EnvParts` from keyword arguments — the env's arguments, declared once:

        * ``MyEnv(**kwargs)`` is ``LLMEnv(build(**kwargs))`` (plus ``render_mode``), with ``build``'s signature;
        * ``MyEnv.Vector`` (also the module's ``MyVectorEnv``) ``(num_envs, group_size=..., autoreset_mode=..., task_assignment=..., num_workers=...,
          **kwargs)`` is its native vector env over the same parts (no hand-written vector class);
        * registered with :func:`gym_llm.registration.register_env`, ``gym.make_vec(id,
          vectorization_mode="vector_entry_point")`` makes ``MyEnv.Vector``.

        ``build`` takes keyword arguments (exactly what the user passed); one that declares ``num_envs`` also gets
        the vector env's batch size (None for the scalar env) to size pools by. The parts may set
        ``respond_workers`` and ``on_vector`` (:class:`~gym_llm.core.episode.EnvParts`) for the vector env.
        """
        if build is not None:
            if not callable(build):
                raise TypeError(f"{cls.__name__}: build= must be a function (**kwargs) -> EnvParts, got {build!r}.")
            cls.build = staticmethod(build)
            if "__init__" not in cls.__dict__:
                cls.__init__ = _scalar_init(build)  # before ConstructorPickle wraps it (super() below)
        super().__init_subclass__(**kwargs)
        if build is not None and "Vector" not in cls.__dict__:
            cls.Vector = _derive_vector(cls, build)
            # ...and a module-level name, so it pickles by reference and registers as "module:<Name>VectorEnv"
            module = sys.modules.get(cls.__module__)
            if module is not None and cls.__qualname__ == cls.__name__:
                vars(module).setdefault(cls.Vector.__name__, cls.Vector)

    def __init__(self, parts: EnvParts, *, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}."
            )
        self.parts = parts
        self.render_mode = render_mode
        self.observation_space = parts.observation_space
        self.action_space = parts.action_space
        self._episode = parts.new_episode()
        self._stream: TaskStream | None = None
        self._round = -1
        self._needs_reset = True

    @property
    def episode(self):
        """The current :class:`~gym_llm.core.episode.Episode` (messages, tokens, task)."""
        return self._episode

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        forced = resolve_reset_task(self.parts.tasks, options)
        super().reset(seed=seed)
        if seed is not None or self._stream is None:
            task_seed = int(self.np_random.integers(TASK_SEED_BOUND))
            self._stream = TaskStream(len(self.parts.tasks), task_seed, self.parts.task_order)
            self._round = 0
        else:
            self._round += 1
        task = forced if forced is not None else self.parts.tasks[self._stream.task_index(self._round)]
        observation, info = self._episode.start(task)
        info["task_id"] = task.task_id
        info["round"] = self._round
        self._needs_reset = False
        return observation, info

    def step(self, action: Any):
        if self._needs_reset:
            raise ResetNeeded(
                "step() was called before reset() or after the episode ended; call env.reset() first."
            )
        checked = self._episode.check_action(action)
        response = self._episode.respond(checked)
        transition = self._episode.advance(checked, response)
        info = transition.info
        info["task_id"] = self._episode.task.task_id
        info["round"] = self._round
        if transition.terminated or transition.truncated:
            self._needs_reset = True
        return transition.observation, transition.reward, transition.terminated, transition.truncated, info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._episode.render()
        return None

    def fork(self, k: int = 1) -> list["LLMEnv"]:
        """``k`` siblings of this env at its current step: each has a copy of the episode (conversation, token
        buffers, task, reward state, hashes, and the live state of its tools: a Python REPL's variables, imports and
        files) and of the RNG and task stream, and diverges from here. Stepping a sibling never changes this env or
        another sibling; closing any of them (this one included) leaves the others working: the shared parts (task
        source, tool pools) close with the last of them.

        Raises:
            ForkError: no episode is in progress (call ``reset()``; an ended episode has nothing left to branch),
                or the episode holds something that cannot be copied (a browser, an MCP server's state, an MLGym
                workspace: the message names it). Nothing was forked then.
            ValueError: ``k`` is not an int >= 1.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"fork(k) takes the number of siblings, an int >= 1, got {k!r}.")
        if self._needs_reset:
            raise ForkError("fork() needs an episode in progress: call reset() first (an episode that has ended "
                            "has no step left to branch from).")
        return make_all(k, lambda: self._sibling(self._episode.fork()))

    def _sibling(self, episode: Any) -> "LLMEnv":
        users = self.__dict__.setdefault("_parts_users", [1])  # shared by every sibling: the parts close with the last
        sibling = object.__new__(type(self))
        sibling.__dict__.update(self.__dict__)
        sibling._episode = episode
        sibling._stream = copy.copy(self._stream)
        sibling._np_random = copy.deepcopy(self._np_random)
        sibling._closed = False
        users[0] += 1
        return sibling

    def close(self) -> None:
        if self.__dict__.get("_closed"):
            return
        self._closed = True
        self._episode.close()
        users = self.__dict__.get("_parts_users")
        if users is not None:
            users[0] -= 1
        if users is None or users[0] <= 0:
            self.parts.close()
        super().close()


LLMVectorEnv.SCALAR_BASE = LLMEnv  # forks of a vector env are LLMEnvs (gym_llm.core.vector cannot import this module)


def vector_name(env_class_name: str) -> str:
    """The derived vector env's class name: ``LLMCountdownEnv`` -> ``LLMCountdownVectorEnv``.

    >>> vector_name("LLMCountdownEnv"), vector_name("Maze")
    ('LLMCountdownVectorEnv', 'MazeVector')
    """
    return env_class_name[:-3] + "VectorEnv" if env_class_name.endswith("Env") else env_class_name + "Vector"


def _keyword_parameters(build: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        parameters = list(inspect.signature(build).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: accept anything
        return [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else p
            for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_ONLY]


def _scalar_init(build: Callable[..., Any]) -> Callable[..., None]:
    sized = "num_envs" in inspect.signature(build).parameters

    def __init__(self, *, render_mode: str | None = None, **kwargs: Any) -> None:
        LLMEnv.__init__(self, build(num_envs=None, **kwargs) if sized else build(**kwargs), render_mode=render_mode)

    __init__.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("render_mode", inspect.Parameter.KEYWORD_ONLY, default=None),
        *[p for p in _keyword_parameters(build) if p.name not in ("render_mode", "num_envs")]])
    return __init__


def _derive_vector(env_cls: type, build: Callable[..., Any]) -> type:
    """``env_cls.Vector``: an :class:`~gym_llm.core.vector.LLMVectorEnv` subclass whose constructor takes the vector
    arguments and passes the rest to ``build``, named :func:`vector_name` of the env class."""
    sized = "num_envs" in inspect.signature(build).parameters  # a build that sizes itself to the batch

    def __init__(self, num_envs: int = 1, *, group_size: int = 1, autoreset_mode: Any = "SameStep",
                 task_assignment: str = "per_group", num_workers: int | None = None, render_mode: str | None = None,
                 **kwargs: Any) -> None:
        parts = build(num_envs=num_envs, **kwargs) if sized else build(**kwargs)
        try:
            LLMVectorEnv.__init__(self, parts, num_envs, group_size=group_size, autoreset_mode=autoreset_mode,
                                  task_assignment=task_assignment, num_workers=num_workers, render_mode=render_mode)
        except BaseException:  # a bad vector argument: stop what the parts started (sandboxes, servers)
            parts.close()
            raise
        if parts.on_vector is not None:
            parts.on_vector(self.num_envs)

    own = inspect.signature(__init__).parameters
    __init__.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        *[p for name, p in own.items() if name != "kwargs"],
        *[p for p in _keyword_parameters(build) if p.name not in own and p.name != "num_envs"]])
    name = vector_name(env_cls.__name__)
    return type(name, (LLMVectorEnv,), {
        "__init__": __init__,
        "__module__": env_cls.__module__,
        "__qualname__": name if env_cls.__qualname__ == env_cls.__name__ else f"{env_cls.__qualname__}.Vector",
        "__doc__": f"Native vector env of :class:`{env_cls.__name__}` (see :class:`~gym_llm.core.vector.LLMVectorEnv`): "
                   f"``{name}(num_envs, group_size=..., **env_kwargs)``.",
    })
