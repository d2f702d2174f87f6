"""``OpenEnv-v0``: any OpenEnv server as a Gymnasium env with text spaces (the reverse of
:mod:`gym_llm.integrations.openenv`), so OpenEnv's env catalogue runs through gym_llm's collector and wrappers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium as gym

from gym_llm.core.extras import MissingExtraError
from gym_llm.core.spaces import UnicodeText

__all__ = ["OpenEnvClientEnv"]

_WIRE_FIELDS = {"done", "reward", "metadata"}  # OpenEnv's own observation fields, not the env's


def _fetch_schema(base_url: str, timeout_s: float) -> dict[str, Any]:
    url = base_url.rstrip("/").replace("ws://", "http://").replace("wss://", "https://") + "/schema"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # the user's server
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ConnectionError(f"OpenEnv-v0 could not read {url} ({type(e).__name__}: {e}); is an OpenEnv server "
                              "running at base_url? (e.g. `gym-llm serve LLMGSM8K-v0 --port 8000` and "
                              "base_url='http://127.0.0.1:8000')") from e


def _string_fields(schema: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(string properties, required string properties) of a JSON schema, OpenEnv's wire fields left out."""
    props = {k: v for k, v in schema.get("properties", {}).items() if k not in _WIRE_FIELDS}
    strings = [k for k, v in props.items() if v.get("type") == "string"]
    return strings, [k for k in strings if k in schema.get("required", ())]


def _action_field(schema: Mapping[str, Any]) -> str:
    strings, required = _string_fields(schema)
    if "text" in strings:
        return "text"
    for candidates in (required, strings):
        if len(candidates) == 1:
            return candidates[0]
    fields = sorted(k for k in schema.get("properties", {}) if k != "metadata")
    raise ValueError(f"OpenEnv-v0 cannot tell which action field takes the text: the server's action fields are "
                     f"{fields} (string ones: {strings}). Pass action_field='<name>' (or action_defaults={{...}} for "
                     "the other required fields).")


def _observation_field(schema: Mapping[str, Any]) -> str | None:
    strings, _ = _string_fields(schema)
    if "text" in strings:
        return "text"
    return strings[0] if len(strings) == 1 else None


class OpenEnvClientEnv(gym.Env):
    """An OpenEnv server's env as a Gymnasium env: one WebSocket session (OpenEnv's ``GenericEnvClient``) per env.

    ## Description
    ``reset`` and ``step`` are the server's, over its ``/ws`` session. The action is text, sent as
    ``{action_field: text, **action_defaults}``; the observation is the text of the server observation's
    ``observation_field`` (the JSON of the whole observation when it has no single text field).

    ## Action Space
    ``UnicodeText(max_action_chars)``.

    ## Observation Space
    ``UnicodeText(max_observation_chars)``; a longer observation is an error naming this argument.

    ## Rewards
    The server's reward (0.0 when it sends none, e.g. after reset).

    ## Episode End
    ``done`` from the server. ``truncated`` is the observation's ``truncated`` field when it has one (gym_llm
    servers do), else False; ``terminated = done and not truncated``.

    ## Info
    A gym_llm server's ``info`` field as is (so ``info`` equals the native env's, JSON-able entries); for other
    servers, the observation's other fields (and OpenEnv's ``metadata`` when sent). ``env.last_observation`` holds
    the whole observation dict.

    ## Arguments
    * ``base_url``: the server (``http://host:port`` or ``ws://host:port``).
    * ``action_field`` / ``observation_field``: override what is read from the server's ``/schema``.
    * ``action_defaults``: other action fields sent with every step (e.g. ``{"tool_name": "echo"}``).
    * ``reset_kwargs``: fields sent with every reset (``reset(options=...)`` adds more; ``seed`` is passed through).
    * ``max_observation_chars``, ``max_action_chars``: the text spaces' sizes.
    * ``connect_timeout_s``, ``message_timeout_s``: OpenEnv client timeouts (a step longer than this fails).

    ## Vectorized environment
    ``gym.make_vec("OpenEnv-v0", num_envs=N, base_url=...)`` (sync or async): N sessions on the server.

    ## Version History
    * v0: initial version.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, base_url: str, *, action_field: str | None = None, observation_field: str | None = None,
                 action_defaults: Mapping[str, Any] | None = None, reset_kwargs: Mapping[str, Any] | None = None,
                 max_observation_chars: int = 131072, max_action_chars: int = 16384,
                 connect_timeout_s: float = 10.0, message_timeout_s: float = 300.0):
        try:
            from openenv.core.generic_client import GenericEnvClient
        except ModuleNotFoundError as e:  # pragma: no cover  (the extra is in [dev])
            raise MissingExtraError(f"OpenEnv-v0 needs the 'openenv' extra, which is not installed (missing: "
                                    f"{e.name}). Install it with: pip install 'gym-llm[openenv]'", name=e.name) from e
        if not isinstance(base_url, str) or "://" not in base_url:
            raise ValueError(f"OpenEnv-v0 expects base_url='http://host:port' (or ws://), got {base_url!r}.")
        schema = _fetch_schema(base_url, connect_timeout_s)
        self.base_url = base_url
        self.action_field = action_field or _action_field(schema.get("action", {}))
        self.observation_field = observation_field or _observation_field(schema.get("observation", {}))
        self.action_defaults = dict(action_defaults or {})
        self.reset_kwargs = dict(reset_kwargs or {})
        self.observation_space = UnicodeText(max_observation_chars)
        self.action_space = UnicodeText(max_action_chars)
        self.last_observation: dict[str, Any] = {}
        self._client = GenericEnvClient(base_url=base_url, connect_timeout_s=connect_timeout_s,
                                        message_timeout_s=message_timeout_s).sync()
        self._client.connect()
        self._closed = False

    def _convert(self, result: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        observation = dict(result.observation or {})
        self.last_observation = observation
        if self.observation_field is not None:
            text = observation.get(self.observation_field)
            if not isinstance(text, str):
                raise ValueError(f"OpenEnv-v0: the server's observation has no text field {self.observation_field!r} "
                                 f"(fields: {sorted(observation)}); pass observation_field='<name>'.")
        else:
            text = json.dumps(observation, sort_keys=True, ensure_ascii=False)
        if len(text) > self.observation_space.max_length:
            raise ValueError(f"OpenEnv-v0: the observation has {len(text)} characters, more than "
                             f"max_observation_chars={self.observation_space.max_length}; make the env with a larger "
                             "max_observation_chars.")
        if isinstance(observation.get("info"), dict):
            info = dict(observation["info"])
        else:
            info = {k: v for k, v in observation.items() if k != self.observation_field}
            if getattr(result, "metadata", None):
                info["metadata"] = result.metadata
        done = bool(result.done)
        truncated = done and bool(observation.get("truncated", False))
        return text, float(result.reward or 0.0), done and not truncated, truncated, info

    def _call(self, what: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, what)(*args, **kwargs)
        except RuntimeError as e:  # GenericEnvClient: "Server error: <message> (code: <CODE>)"
            raise RuntimeError(f"OpenEnv-v0: the server at {self.base_url} refused {what}: {e}") from e

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        fields = {**self.reset_kwargs, **(options or {})}
        if seed is not None:
            fields["seed"] = int(seed)
        text, _, _, _, info = self._convert(self._call("reset", **fields))
        return text, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"OpenEnv-v0.step expects the action text (str), got {type(action).__name__}.")
        return self._convert(self._call("step", {**self.action_defaults, self.action_field: action}))

    def close(self) -> None:
        """Close the session (the server frees its env); idempotent."""
        if not getattr(self, "_closed", True):
            self._closed = True
            self._client.close()
        super().close()
