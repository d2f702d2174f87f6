"""gym_llm envs served over OpenEnv's protocol, and any OpenEnv server as a Gymnasium env (``OpenEnv-v0``).

**Server.** :func:`create_app` builds an OpenEnv server (OpenEnv's own ``HTTPEnvServer`` routes on a FastAPI app) for
any registered gym_llm id in text mode; :func:`serve` runs it with uvicorn (``gym-llm serve ENV --port N`` is the
command), :func:`start_server` runs it in a background thread. The protocol is OpenEnv's:

- ``/ws`` (WebSocket): one session per connection, one gym_llm env per session. Messages ``{"type": "reset", "data":
  {"seed", "episode_id", "task_id"}}``, ``{"type": "step", "data": {"text": reply}}``, ``{"type": "state"}``,
  ``{"type": "close"}``; answers ``{"type": "observation", "data": {"observation", "reward", "done"}}``, ``{"type":
  "state", "data": ...}`` or ``{"type": "error", "data": {"message", "code"}}``. OpenEnv's ``EnvClient`` (and
  ``GenericEnvClient``, and TRL code built on them) speak it.
- ``POST /reset``, ``POST /step``, ``GET /state`` (HTTP): OpenEnv's stateless simulation endpoints; each request gets a
  fresh env, so an episode of more than one step needs ``/ws``. ``GET /schema``, ``/metadata``, ``/health`` describe
  the env; ``GET /gym_llm/sessions`` (ours) counts live sessions and open envs.

Typed models: :class:`GymLLMAction` (``text``: the reply), :class:`GymLLMObservation` (``text``: the env's observation,
the rendered conversation up to the generation prompt; ``messages``: the conversation so far in OpenAI form;
``info``: the step's ``info`` where JSON-able; ``terminated``/``truncated``; ``reward``; ``done = terminated or
truncated``), :class:`GymLLMState` (episode id, step count, task id, round, return so far). Token ids are not carried:
OpenEnv speaks text here, and a client tokenizes with its own tokenizer.

**Session lifetime.** A session (and its env: sandbox, browser, worker processes) is freed when its WebSocket closes:
a ``close`` message, a client that exits or is killed (the kernel closes its socket: freed at once, or when the
running step returns), or a client that stops answering (a frozen process, a lost network): uvicorn pings every
``ping_interval_s`` and drops a connection whose pong is ``ping_timeout_s`` late, so it is freed within
``ping_interval_s + ping_timeout_s`` (+ the running step, bounded by the env's own tool timeouts). A connected client
that sends nothing for ``idle_timeout_s`` loses its session too (OpenEnv's reaper checks every ``max(idle_timeout_s /
4, 5)`` s). At most ``max_sessions`` sessions live at once; one more gets ``CAPACITY_REACHED``.

**Errors.** A bad request gets a protocol error and the session (and server) go on: an unknown message type
(``UNKNOWN_TYPE``), invalid JSON (``INVALID_JSON``), an action with a wrong type or unknown fields
(``VALIDATION_ERROR``), a step before reset or after the episode ended, unknown reset fields, or a reply the env
refuses (``EXECUTION_ERROR``, the message says what was expected and the fix). Over HTTP these are 422 / 409.

**Client.** :class:`OpenEnvClientEnv` (``gym.make("OpenEnv-v0", base_url=...)``) drives any OpenEnv server through
OpenEnv's ``GenericEnvClient`` as a Gymnasium env with text spaces: the action text goes into the server's action
field (found from ``/schema``), the observation text comes from its observation's text field.

Needs ``openenv-core`` (``pip install 'gym-llm[openenv]'``; tested with 0.3.0, whose wire protocol the ``openenv``
0.10 client also speaks). Imports no torch; importing OpenEnv itself takes a few seconds (it imports gradio).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gym_llm.integrations.openenv_client import OpenEnvClientEnv  # the reverse direction (imports OpenEnv on use)

if TYPE_CHECKING:
    from gym_llm.integrations._openenv_server import (
        GymLLMAction,
        GymLLMEnvironment,
        GymLLMObservation,
        GymLLMRequestError,
        GymLLMState,
        ServerHandle,
        create_app,
        serve,
        start_server,
    )

__all__ = ["GymLLMAction", "GymLLMEnvironment", "GymLLMObservation", "GymLLMRequestError", "GymLLMState",
           "OpenEnvClientEnv", "ServerHandle", "create_app", "serve", "start_server"]


def __getattr__(name: str) -> Any:
    """The server's names, from :mod:`gym_llm.integrations._openenv_server` on first use: importing OpenEnv takes a few
    seconds (it imports gradio), which ``import gym_llm.integrations.openenv`` alone (docs, doctests) does not pay."""
    if name in __all__:
        from gym_llm.integrations import _openenv_server

        return getattr(_openenv_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
