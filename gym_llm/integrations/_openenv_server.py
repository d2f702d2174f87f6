"""The OpenEnv server behind :mod:`gym_llm.integrations.openenv` (imported on first use: OpenEnv takes seconds to
import). Read that module's docstring; import the names from there."""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from pydantic import Field, StrictStr

from gym_llm.core.extras import MissingExtraError

try:
    from openenv.core.env_server.http_server import HTTPEnvServer
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, ConcurrencyConfig, EnvironmentMetadata, Observation, State
except ModuleNotFoundError as e:  # pragma: no cover  (the extra is in [dev])
    raise MissingExtraError(
        f"gym_llm.integrations.openenv needs the 'openenv' extra, which is not installed (missing: {e.name}). "
        "Install it with: pip install 'gym-llm[openenv]'", name=e.name) from e

__all__ = ["GymLLMAction", "GymLLMEnvironment", "GymLLMObservation", "GymLLMRequestError", "GymLLMState",
           "ServerHandle", "create_app", "serve", "start_server"]

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ typed models
class GymLLMAction(Action):
    """One policy turn: the reply text (what ``env.step`` takes in text mode). Unknown fields are refused."""

    text: StrictStr = Field(description="the policy's reply (assistant turn), as text")


class GymLLMObservation(Observation):
    """What the env shows after ``reset`` or ``step``, plus the step's ``info``.

    ``reward`` is None after reset and the step's reward after a step; ``done = terminated or truncated``.
    """

    text: str = Field(default="", description="the env's observation: the conversation rendered up to the "
                                              "generation prompt")
    messages: list[dict[str, Any]] = Field(default_factory=list, description="the conversation so far, OpenAI form "
                                                                            "(empty for envs without one)")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info, JSON-able entries only")
    terminated: bool = Field(default=False, description="the episode ended (task solved/failed, no more turns)")
    truncated: bool = Field(default=False, description="the episode was cut off (length or turn limit)")


class GymLLMState(State):
    """A session's episode: OpenEnv's ``episode_id``/``step_count`` plus the gym_llm task and the return so far."""

    env_id: str = ""
    task_id: int | None = None
    round: int | None = None
    terminated: bool = False
    truncated: bool = False
    total_reward: float = 0.0


class GymLLMRequestError(ValueError):
    """A request the session cannot serve (step before reset, unknown reset fields, a reply the env refuses); the
    session is unchanged. Sent as an ``EXECUTION_ERROR`` over ``/ws`` and HTTP 409 over ``/step``/``/reset``."""


# --------------------------------------------------------------------------------------------------- helpers
_DROP = object()


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON types (numpy scalars and arrays converted), or ``_DROP`` when it has none."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Mapping):
        out = {str(k): _jsonable(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not _DROP}
    if isinstance(value, (list, tuple)):
        items = [_jsonable(v) for v in value]
        return _DROP if any(v is _DROP for v in items) else items
    return _DROP


def _json_info(info: Mapping[str, Any]) -> dict[str, Any]:
    out = _jsonable(info)
    dropped = sorted(set(info) - set(out))
    if dropped:
        logger.debug("info entries without a JSON form are not sent: %s", dropped)
    return out


@dataclass
class _EnvCounts:
    """How many gym_llm envs this server has opened and closed (``GET /gym_llm/sessions``)."""

    opened: int = 0
    closed: int = 0

    def __post_init__(self) -> None:
        self.lock = threading.Lock()

    def add(self, *, opened: int = 0, closed: int = 0) -> None:
        with self.lock:
            self.opened += opened
            self.closed += closed


# ---------------------------------------------------------------------------------------------- the env server
class GymLLMEnvironment(Environment[GymLLMAction, GymLLMObservation, GymLLMState]):
    """One OpenEnv session's env: a gym_llm env (text mode) made on the first reset, closed with the session.

    Args:
        env_id: a registered gym_llm id.
        env_kwargs: its constructor arguments (text mode: no ``mode="tokens"``).
        counts: the server's env counters (internal).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # one gym_llm env per session: nothing shared but read-only task data

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any] | None = None, counts: _EnvCounts | None = None):
        super().__init__()
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self._counts = counts
        self._env: gym.Env | None = None  # made lazily: OpenEnv also builds one per /metadata, /state, /schema call
        self._state = GymLLMState(env_id=env_id)
        self._needs_reset = True
        self._closed = False

    def _gym_env(self) -> gym.Env:
        if self._closed:
            raise GymLLMRequestError("this session was closed (idle too long, or the server is stopping); open a new "
                                     "connection and reset.")
        if self._env is None:
            self._env = gym.make(self.env_id, **self.env_kwargs)
            if self._counts is not None:
                self._counts.add(opened=1)
        return self._env

    def _observation(self, text: Any, info: Mapping[str, Any], reward: float | None, terminated: bool,
                     truncated: bool) -> GymLLMObservation:
        episode = getattr(self._gym_env().unwrapped, "episode", None)
        messages = [m.to_dict() for m in getattr(episode, "messages", ())]
        return GymLLMObservation(text=text, messages=messages, info=_json_info(info), reward=reward,
                                 done=terminated or truncated, terminated=terminated, truncated=truncated)

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: int | None = None,
              **kwargs: Any) -> GymLLMObservation:
        """Start an episode: ``seed`` seeds the task stream (as ``env.reset(seed=...)``), ``task_id`` picks a task
        (``options={"task_id": ...}``), ``episode_id`` names it (default: a fresh uuid)."""
        if kwargs:
            raise GymLLMRequestError(f"reset got unknown fields {sorted(kwargs)}; it takes seed (int >= 0), task_id "
                                     "(int, an index into the env's tasks) and episode_id (str).")
        for name, value in (("seed", seed), ("task_id", task_id)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise GymLLMRequestError(f"reset: {name} must be an int >= 0 or null, got {value!r}.")
        env = self._gym_env()
        try:
            text, info = env.reset(seed=seed, options=None if task_id is None else {"task_id": task_id})
        except (ValueError, TypeError, IndexError) as e:
            raise GymLLMRequestError(f"{self.env_id} refused reset(seed={seed}, task_id={task_id}): {e}") from e
        self._needs_reset = False
        self._state = GymLLMState(env_id=self.env_id, episode_id=episode_id or str(uuid.uuid4()), step_count=0,
                                  task_id=info.get("task_id"), round=info.get("round"))
        return self._observation(text, info, None, False, False)

    def step(self, action: GymLLMAction, timeout_s: float | None = None, **kwargs: Any) -> GymLLMObservation:
        """One turn: ``env.step(action.text)``. ``timeout_s`` is ignored (the env's tools have their own limits)."""
        if not isinstance(action, GymLLMAction):
            raise GymLLMRequestError(f"step expects a GymLLMAction ({{'text': reply}}), got {type(action).__name__}.")
        env = self._gym_env()
        if self._needs_reset:
            raise GymLLMRequestError("step before reset (or after the episode ended): send a reset first.")
        try:
            text, reward, terminated, truncated, info = env.step(action.text)
        except (ValueError, TypeError) as e:  # the env checked the action and refused it; it is unchanged
            raise GymLLMRequestError(f"{self.env_id} refused the reply: {e}") from e
        terminated, truncated = bool(terminated), bool(truncated)
        self._needs_reset = terminated or truncated
        state = self._state
        self._state = state.model_copy(update={"step_count": state.step_count + 1, "terminated": terminated,
                                               "truncated": truncated,
                                               "total_reward": state.total_reward + float(reward)})
        return self._observation(text, info, float(reward), terminated, truncated)

    @property
    def state(self) -> GymLLMState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        import gym_llm

        from gym_llm.registration import registered_envs

        info = next((i for i in registered_envs() if i.id == self.env_id), None)
        return EnvironmentMetadata(name=self.env_id, description=info.description if info else self.env_id,
                                   version=gym_llm.__version__, author="gym-llm")

    def close(self) -> None:
        """Close the gym_llm env (its sandbox, browser, workers); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._env is not None:
            self._env.close()
            if self._counts is not None:
                self._counts.add(closed=1)


def _check_servable(env_id: str, env_kwargs: Mapping[str, Any]) -> None:
    """Make the env once: an unknown id, a bad argument or a non-text env fails now, not in the first session."""
    import gym_llm  # noqa: F401  (registers the ids, plugins' included)
    from gym_llm.registration import registered_envs

    ids = [info.id for info in registered_envs()]
    if env_id not in ids:
        raise ValueError(f"unknown gym_llm env id {env_id!r}; the ids are: {', '.join(ids)}.")
    if env_kwargs.get("mode", "text") != "text":
        raise ValueError(f"the OpenEnv server speaks text; got mode={env_kwargs['mode']!r}. Drop 'mode' (token ids "
                         "are not carried: a client tokenizes the text with its own tokenizer).")
    env = gym.make(env_id, **env_kwargs)
    try:
        spaces = (env.observation_space, env.action_space)
    finally:
        env.close()
    if not all(isinstance(space, gym.spaces.Text) for space in spaces):
        raise ValueError(f"{env_id} is not a text env (observation {spaces[0]}, action {spaces[1]}); the OpenEnv "
                         "server serves envs whose observations and actions are text.")


class _QuietClosedSocket:
    """ASGI middleware: OpenEnv 0.3.0 closes a session's WebSocket in a ``finally`` that expects RuntimeError, while
    starlette >= 1 raises ``WebSocketDisconnect`` there when the client has already gone — after the session and its
    env were freed. That one exception is expected, not a server error; everything else passes through."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass


def create_app(env_id: str, env_kwargs: Mapping[str, Any] | None = None, *, max_sessions: int = 64,
               idle_timeout_s: float | None = 600.0) -> Any:
    """A FastAPI app serving ``env_id`` over OpenEnv's protocol (see the module docstring).

    Args:
        env_id: a registered gym_llm id whose text mode has text spaces (every id but ``LLMHashing-v0``).
        env_kwargs: the env's constructor arguments, as ``gym.make`` takes them.
        max_sessions: the most sessions (envs) alive at once.
        idle_timeout_s: a session that sends nothing for this long is closed (None: never).
    """
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    kwargs = dict(env_kwargs or {})
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}.")
    if idle_timeout_s is not None and not idle_timeout_s > 0:
        raise ValueError(f"idle_timeout_s must be > 0 seconds or None (never), got {idle_timeout_s!r}.")
    _check_servable(env_id, kwargs)
    counts = _EnvCounts()
    server = HTTPEnvServer(
        functools.partial(GymLLMEnvironment, env_id, kwargs, counts), GymLLMAction, GymLLMObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=idle_timeout_s))
    app = FastAPI(title=f"gym-llm {env_id} (OpenEnv)", description=f"The gym_llm env {env_id} over OpenEnv's protocol.")
    server.register_routes(app)
    app.add_middleware(_QuietClosedSocket)

    @app.get("/gym_llm/sessions", tags=["Health"], summary="Live sessions and open envs")
    def sessions() -> dict[str, Any]:
        return {"env_id": env_id, "active_sessions": server.active_sessions, "max_sessions": max_sessions,
                "envs_opened": counts.opened, "envs_closed": counts.closed, "envs_open": counts.opened - counts.closed}

    @app.exception_handler(GymLLMRequestError)
    async def request_error(request: Any, exc: GymLLMRequestError) -> Any:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    app.state.openenv_server, app.state.env_counts = server, counts
    return app


def _uvicorn_config(app: Any, host: str, port: int, ping_interval_s: float, ping_timeout_s: float,
                    log_level: str) -> Any:
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, ws_ping_interval=ping_interval_s, ws_ping_timeout=ping_timeout_s,
                          log_level=log_level, lifespan="on")


def serve(env_id: str, env_kwargs: Mapping[str, Any] | None = None, *, host: str = "127.0.0.1", port: int = 8000,
          max_sessions: int = 64, idle_timeout_s: float | None = 600.0, ping_interval_s: float = 10.0,
          ping_timeout_s: float = 10.0, log_level: str = "info") -> None:
    """Serve ``env_id`` until interrupted (``gym-llm serve``). A client that stops answering is dropped, and its
    env closed, within ``ping_interval_s + ping_timeout_s`` seconds (see the module docstring)."""
    import uvicorn

    app = create_app(env_id, env_kwargs, max_sessions=max_sessions, idle_timeout_s=idle_timeout_s)
    uvicorn.Server(_uvicorn_config(app, host, port, ping_interval_s, ping_timeout_s, log_level)).run()


class ServerHandle:
    """A server running in a background thread (:func:`start_server`): ``url``, ``app``, ``stop()``; a context
    manager."""

    def __init__(self, server: Any, thread: threading.Thread, app: Any):
        self._server, self._thread, self.app = server, thread, app
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"

    def sessions(self) -> dict[str, Any]:
        """``GET /gym_llm/sessions``, read in process."""
        server, counts = self.app.state.openenv_server, self.app.state.env_counts
        return {"active_sessions": server.active_sessions, "envs_open": counts.opened - counts.closed,
                "envs_closed": counts.closed}

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(env_id: str, env_kwargs: Mapping[str, Any] | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, max_sessions: int = 64, idle_timeout_s: float | None = 600.0,
                 ping_interval_s: float = 10.0, ping_timeout_s: float = 10.0, log_level: str = "warning",
                 startup_timeout_s: float = 30.0) -> ServerHandle:
    """:func:`serve` in a daemon thread; returns once it accepts connections (``port=0``: a free port)."""
    import uvicorn

    app = create_app(env_id, env_kwargs, max_sessions=max_sessions, idle_timeout_s=idle_timeout_s)
    server = uvicorn.Server(_uvicorn_config(app, host, port, ping_interval_s, ping_timeout_s, log_level))
    thread = threading.Thread(target=server.run, name=f"openenv-{env_id}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the OpenEnv server for {env_id} did not start on {host}:{port} within "
                               f"{startup_timeout_s} s (is the port taken?).")
        time.sleep(0.02)
    return ServerHandle(server, thread, app)

