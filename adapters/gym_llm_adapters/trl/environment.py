"""TRL's ``environment_factory``: a gym_llm tool env as a TRL environment class.

``GRPOTrainer(..., environment_factory=environment_factory("LLMPythonTool-v0", **env_kwargs),
reward_funcs=environment_reward)``.

The contract (TRL 1.16, ``GRPOTrainer.__init__`` / ``_generate_and_score_completions`` / ``_tool_call_loop``):
TRL calls the factory with no arguments, once to probe and then once per concurrent rollout (instances are pooled
and reused). Every public method of the instance's *class* except ``reset`` and ``get_reward`` is a tool: TRL
derives its JSON schema from the signature and Google-style docstring (``transformers.utils.get_json_schema``),
renders the prompt with those schemas, parses the model's tool calls with the tokenizer's response template, calls
``method(**arguments)`` and appends ``str(result)`` as a ``tool`` message (token ids masked out of the loss), then
generates again — until a reply has no tool call, ``max_tool_calling_iterations`` or ``max_completion_length``.
Before each rollout TRL calls ``reset(**row)`` with the dataset row; reward functions get the instances as
``environments=``.

What an instance of the class built here does:

1. ``reset(**row)`` resets its own scalar env (text mode) to the row's ``task_id`` (and ``seed``), checks that the
   row's ``prompt`` is the env's opening conversation for that task, and returns None (the prompt is the row's);
2. each tool method (one per function of the env's tools: ``python(code)`` for ``LLMPythonTool-v0``, the server's
   functions for MCP tools, the browser's actions) runs the call in the episode's own tool session — the same
   :class:`~gym_llm.tools.handler.Toolbox` path, sandbox REPL and output formatting as the env's ``step`` — and
   returns the tool message's text;
3. :func:`environment_reward` replays TRL's conversation (its assistant messages, in order) through the env's
   ``step``, answering the tool calls the env parses from the results the methods already returned (nothing runs
   twice), and returns the env's episode return: turn limits, malformed calls and the task's scorer are the env's
   own.

See ``docs/trl.md`` ("TRL's environment_factory") for what TRL's loop cannot express and how its masks compare with
the env's.
"""

from __future__ import annotations

import inspect
import json
import keyword
import logging
import threading
import weakref
from typing import Any, Literal, Mapping, Sequence

from gym_llm.tools.base import ToolCall, ToolResult

__all__ = ["GymLLMEnvironment", "EnvironmentFactory", "environment_factory", "environment_reward",
           "HERMES_RESPONSE_TEMPLATE", "add_response_template"]

logger = logging.getLogger(__name__)

_SESSIONS = "gym_llm.tools"  # where ToolHandler keeps an episode's sessions (gym_llm.tools.handler)
_RESERVED = ("mode", "tokenizer", "vocab_size", "max_action_tokens", "max_seq_len", "record_messages")
_TRL_NAMES = ("reset", "get_reward")
_JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                                "object": dict}
_UNSET: Any = type("_Unset", (), {"__repr__": lambda self: "<unset>"})()  # an argument the model did not pass


HERMES_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True, "content": "json",
                       "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
"""A transformers response template for ChatML replies with Hermes-style ``<tool_call>{"name", "arguments"}
</tool_call>`` calls — what gym_llm's built-in template (:data:`gym_llm.core.templates.CHATML_TEMPLATE`) renders and
what the envs parse. TRL 1.16 sets a response template itself only for chat templates it knows by their exact text
(Qwen2.5/3, Llama 3.1, ...); :func:`add_response_template` sets this one for the others."""


def add_response_template(tokenizer: Any) -> Any:
    """Make TRL able to parse tool calls from ``tokenizer``'s replies; returns ``tokenizer`` (changed in place).

    Keeps a ``response_template`` / ``response_schema`` the tokenizer already has; else uses TRL's own for the chat
    templates TRL knows (``trl.chat_template_utils.add_response_schema``); else, for a ChatML template that renders
    Hermes-style ``<tool_call>`` calls (gym_llm's built-in template and most ChatML tool templates), sets
    :data:`HERMES_RESPONSE_TEMPLATE`.

    Raises:
        ValueError: the template is neither known to TRL nor ChatML with ``<tool_call>`` calls.
    """
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return tokenizer
    from trl.chat_template_utils import add_response_schema

    try:
        return add_response_schema(tokenizer)
    except ValueError:
        pass
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "<|im_start|>" not in template or "<tool_call>" not in template:
        raise ValueError(
            "TRL cannot parse tool calls for this tokenizer's chat template: expected one TRL knows (Qwen2.5/3, Llama "
            "3.1, ...) or a ChatML template with <tool_call> JSON calls (gym_llm.core.templates.CHATML_TEMPLATE); got "
            f"{'no template' if template is None else 'another template'}. Fix: set tokenizer.chat_template to one of "
            "those, or set tokenizer.response_template to a transformers response template for your format."
        )
    tokenizer.response_template = json.loads(json.dumps(HERMES_RESPONSE_TEMPLATE))  # a copy the tokenizer owns
    return tokenizer


# ------------------------------------------------------------------------------------------------- tool methods
def _annotation(name: str, prop: Mapping[str, Any], where: str) -> Any:
    """The Python type hint whose transformers JSON schema is ``prop`` (without its description)."""
    if "enum" in prop and all(isinstance(v, (str, int, float, bool)) for v in prop["enum"]) and prop["enum"]:
        return Literal[tuple(prop["enum"])]
    kind = prop.get("type")
    if kind == "array" and isinstance(prop.get("items"), Mapping) and prop["items"].get("type") in _JSON_TYPES:
        return list[_JSON_TYPES[prop["items"]["type"]]]
    if isinstance(kind, str) and kind in _JSON_TYPES:
        return _JSON_TYPES[kind]
    raise ValueError(
        f"{where}: argument {name!r} has JSON schema {dict(prop)!r}; expected a 'type' among {sorted(_JSON_TYPES)} "
        "(or an 'enum'). TRL builds tool schemas from Python type hints, which cannot express this one. Fix: give the "
        "tool a simpler schema, or use EnvRolloutFunc, where the env renders its tools' own schemas."
    )


def _docstring(description: str, properties: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [description.strip() or "A tool."]
    if properties:
        lines += ["", "Args:"]
        for arg, prop in properties.items():
            text = " ".join(str(prop.get("description") or f"The {arg} argument.").split())
            lines.append(f"    {arg}: {text}")
    return "\n".join(lines)


def _tool_method(schema: Mapping[str, Any]) -> Any:
    """A method ``name(self, **arguments) -> str`` whose signature and docstring give TRL ``schema`` back."""
    function = schema.get("function", schema)
    name = function["name"]
    where = f"Tool {name!r}"
    if not isinstance(name, str) or not name or name.startswith("_") or name in _TRL_NAMES:
        raise ValueError(
            f"{where}: TRL exposes public methods other than {list(_TRL_NAMES)} as tools, so a tool cannot be named "
            f"{name!r}. Fix: rename the tool (e.g. MCPTool's or BrowserTool's name_prefix=)."
        )
    parameters = function.get("parameters") or {}
    properties = dict(parameters.get("properties") or {})
    required = set(parameters.get("required") or ())
    signature_params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}  # no return hint: transformers would add a "return" entry the env's schema lacks
    for arg, prop in properties.items():
        if not arg.isidentifier() or keyword.iskeyword(arg):
            raise ValueError(f"{where}: argument {arg!r} is not a Python identifier, so TRL cannot call it. Fix: "
                             "rename the argument in the tool's schema.")
        annotations[arg] = _annotation(arg, prop, where)
        default = inspect.Parameter.empty if arg in required else _UNSET
        signature_params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default,
                                                  annotation=annotations[arg]))

    def method(self, **arguments):  # noqa: ANN001, ANN202 (hints live in __annotations__/__signature__ below)
        return self._call_tool(name, {k: v for k, v in arguments.items() if v is not _UNSET})

    method.__name__ = method.__qualname__ = name
    method.__doc__ = _docstring(function.get("description") or "", properties)
    method.__annotations__ = annotations
    method.__signature__ = inspect.Signature(signature_params)  # type: ignore[attr-defined]
    return method


# ------------------------------------------------------------------------------------------------- environment
class _ReplaySessions:
    """An episode's tool sessions while :meth:`GymLLMEnvironment._score` replays it: a call the tool methods already
    ran (same name and arguments, in order) is answered with its recorded result; any other runs live."""

    def __init__(self, recorded: list[ToolResult], live: Any):
        self.recorded, self.live, self.replayed, self.ran_live = list(recorded), live, 0, 0

    def run(self, tool: Any, call: ToolCall) -> ToolResult:
        if self.recorded and (self.recorded[0].call.name, dict(self.recorded[0].call.arguments)) == (
                call.name, dict(call.arguments)):
            self.replayed += 1
            return self.recorded.pop(0)
        self.ran_live += 1
        return self.live.run(tool, call)

    def close(self) -> None:
        self.live.close()


class GymLLMEnvironment:
    """Base of the TRL environment classes :func:`environment_factory` builds: one gym_llm episode at a time.

    The subclass adds one public method per tool function; this class has no other public method but ``reset``
    (TRL takes every other public method for a tool), so scoring is ``_score`` (called by :func:`environment_reward`).
    The last scored episode's return is ``last_reward``; ``last_info``: the env's final ``info`` plus ``ended`` (the
    env's episode ended), ``extra_turns`` (TRL's replies after it ended, not scored), ``replayed_tool_calls`` (calls
    answered from the methods' results), ``live_tool_calls`` (calls the env parsed that TRL did not run: run now) and
    ``unreplayed_tool_calls`` (results the methods returned that the env's replay never asked for).
    """

    _env_id: str = ""
    _env_kwargs: dict[str, Any] = {}
    _factory: "EnvironmentFactory | None" = None

    def __init__(self) -> None:
        import gymnasium as gym

        import gym_llm  # noqa: F401  (registers the ids)

        self._env = gym.make(self._env_id, disable_env_checker=True, mode="text", **self._env_kwargs)
        self._results: list[ToolResult] = []
        self._reward: float | None = None
        self._task_id: int | None = None
        self.last_reward: float | None = None
        self.last_info: dict[str, Any] = {}
        if self._factory is not None:
            self._factory._created.add(self)

    def reset(self, **row: Any) -> None:
        """Start the row's task: ``task_id`` (int, required), ``seed`` (optional: seeds the env's randomness, e.g. a
        user simulator); ``prompt`` (optional) must be the env's opening conversation for that task. Returns None:
        the model sees the row's prompt."""
        if "task_id" not in row:
            raise ValueError(
                f"{self._env_id} environment: reset() needs the row's 'task_id'; the row has columns {sorted(row)}. "
                "Fix: build the train dataset with gym_llm_adapters.trl.env_dataset(env_id, **env_kwargs) using the "
                "same env arguments as environment_factory."
            )
        seed = row.get("seed")
        self._close_episode()
        self._env.reset(seed=None if seed is None else int(seed), options={"task_id": int(row["task_id"])})
        self._results, self._reward, self._task_id = [], None, int(row["task_id"])
        prompt = row.get("prompt")
        if isinstance(prompt, Sequence) and prompt and isinstance(prompt[0], Mapping):
            opening = [(m.role, m.content) for m in self._episode.messages]
            got = [(m.get("role"), m.get("content")) for m in prompt]
            if got != opening:
                raise ValueError(
                    f"{self._env_id} environment: the row's prompt is not the env's opening conversation for task "
                    f"{row['task_id']} (expected {opening!r:.300}, got {got!r:.300}). Fix: build the dataset with "
                    "env_dataset(env_id, **env_kwargs) and the same env arguments (system_prompt=, prompt_template=, "
                    "data_files=, ...) as environment_factory."
                )

    @property
    def _episode(self) -> Any:
        return self._env.unwrapped.episode

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one call in this episode's tool session, as the env's step would; the tool message's text."""
        episode = self._episode
        sessions = episode.resources.get(_SESSIONS)
        if self._task_id is None or sessions is None or self._reward is not None:
            raise RuntimeError(f"{self._env_id} environment: tool {name!r} called outside an episode; call reset() "
                               "first (TRL does before every rollout).")
        result = episode.common.handler.toolbox.run([ToolCall(name, arguments)], sessions)[0]
        self._results.append(result)
        return result.content

    def _score(self, completion: Sequence[Mapping[str, Any]] | str) -> float:
        """The env's episode return for TRL's ``completion`` of this episode (its messages: assistant replies with
        ``content`` and ``tool_calls``, tool results), by replaying the replies through the env's ``step``. Cached:
        a second call returns the same value."""
        if self._reward is not None:
            return self._reward
        if self._task_id is None:
            raise RuntimeError(f"{self._env_id} environment: score() before reset(); TRL resets before each rollout.")
        replies = [completion] if isinstance(completion, str) else [
            _reply_text(m) for m in completion if isinstance(m, Mapping) and m.get("role") == "assistant"]
        episode = self._episode
        replay = _ReplaySessions(self._results, episode.resources.get(_SESSIONS))
        if replay.live is not None:
            episode.resources[_SESSIONS] = replay
        total, ended, turns, info = 0.0, False, 0, {}
        for reply in replies:
            if ended:
                break
            _, reward, terminated, truncated, info = self._env.step(reply)
            total, turns, ended = total + float(reward), turns + 1, bool(terminated or truncated)
        self._reward, self.last_reward = total, total
        self.last_info = {**info, "ended": ended, "extra_turns": len(replies) - turns,
                          "replayed_tool_calls": replay.replayed, "live_tool_calls": replay.ran_live,
                          "unreplayed_tool_calls": len(replay.recorded)}
        if replay.ran_live or replay.recorded or len(replies) > turns:
            logger.debug("task %s: TRL's episode and the env's differ (%s)", self._task_id, self.last_info)
        self._close_episode()
        return total

    def _close_episode(self) -> None:
        self._episode.close()  # frees the sandbox session now (idempotent)

    def _close(self) -> None:
        self._env.close()


def _reply_text(message: Mapping[str, Any]) -> str:
    """An assistant message as TRL parsed it, back to reply text the env parses: reasoning, content, then each
    tool call as gym_llm's template renders it (``\\n<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``)."""
    content = message.get("content") or ""
    if not isinstance(content, str):  # typed content blocks
        content = "".join(block.get("text", "") for block in content if isinstance(block, Mapping))
    reasoning = message.get("reasoning_content")
    text = (f"<think>{reasoning}</think>" if reasoning else "") + content
    for call in message.get("tool_calls") or ():
        function = call.get("function", call)
        payload = {"name": function.get("name"), "arguments": function.get("arguments", {})}
        text += "\n<tool_call>\n" + json.dumps(payload, ensure_ascii=False) + "\n</tool_call>"
    return text


# ------------------------------------------------------------------------------------------------- factory
class EnvironmentFactory:
    """``environment_factory=`` for TRL's ``GRPOTrainer``: each call returns a new instance of
    :attr:`environment_class`. Built by :func:`environment_factory`.

    Attributes:
        env_id, env_kwargs: the env and its arguments.
        environment_class: the TRL environment class (a :class:`GymLLMEnvironment` with one method per tool).
        tool_schemas: the env's tool schemas (what the env's own template renders).
        max_turns: the env's ``max_turns``.
        max_tool_calling_iterations: ``max_turns - 1``: pass it to ``GRPOConfig`` so TRL stops where the env does
            (the env scores the reply of turn ``max_turns`` without running its calls).
    """

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any], probe: Any):
        from gym_llm_adapters.trl.dataset import chat_common

        chat = chat_common(probe)
        handler = chat.handler
        toolbox = getattr(handler, "toolbox", None)
        max_turns = int(chat.config.max_turns)
        if toolbox is None and max_turns > 1:
            raise ValueError(
                f"{env_id} has no tools and is multi-turn (max_turns={max_turns}), and TRL's environment_factory "
                "continues an episode only through tool calls (the model calls the environment's methods): the env's "
                "follow-up turns could never happen. Expected a tool env (LLMPythonTool-v0, LLMBrowser-v0, or a chat "
                "env with tools=[...], e.g. LLMChat-v0 with tools=[MCPTool(...)]) or a single-turn env (GSM8K, "
                "IFEval, ...). Fix: pass tools=[...], or train this env with EnvRolloutFunc (env-driven turns)."
            )
        # A single-turn env without tools is a class with no tool methods: TRL generates one reply and
        # environment_reward scores it with the env (as EnvReward does).
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs)
        self.tool_schemas = toolbox.schemas() if toolbox is not None else []
        self.max_turns = max_turns
        self.max_tool_calling_iterations = self.max_turns - 1
        methods = {}
        for schema in self.tool_schemas:
            method = _tool_method(schema)
            if method.__name__ in methods:
                raise ValueError(f"{env_id}: two tools are named {method.__name__!r}. Fix: give one a name_prefix=.")
            methods[method.__name__] = method
        name = "".join(ch for ch in env_id.split("-")[0] if ch.isalnum()) + "Environment"
        self.environment_class: type[GymLLMEnvironment] = type(name, (GymLLMEnvironment,), {
            "__module__": __name__, "__doc__": f"{env_id} as a TRL environment: tools {sorted(methods)}.",
            "_env_id": env_id, "_env_kwargs": self.env_kwargs, "_factory": self, **methods})
        self._created: weakref.WeakSet[GymLLMEnvironment] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.__name__ = name

    def __call__(self) -> GymLLMEnvironment:
        with self._lock:
            return self.environment_class()

    def close(self) -> None:
        """Close the envs of every instance made so far (tool sandboxes, servers)."""
        for instance in list(self._created):
            instance._close()
        self._created = weakref.WeakSet()

    def __enter__(self) -> "EnvironmentFactory":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def environment_factory(env_id: str, **env_kwargs: Any) -> EnvironmentFactory:
    """A TRL ``environment_factory`` for a gym_llm tool env (see the module docstring).

    Args:
        env_id: a registered gym_llm chat env with tools: ``LLMPythonTool-v0``, ``LLMBrowser-v0``, or any chat env
            given ``tools=[...]`` (``LLMChat-v0``, ``LLMGSM8K-v0``, ... with ``MCPTool``/``PythonTool``).
        **env_kwargs: the env's arguments — the same as the dataset's (:func:`~gym_llm_adapters.trl.env_dataset`),
            so task ids and prompts agree. The env runs in text mode; ``mode``, ``tokenizer``, ``vocab_size``,
            ``max_action_tokens``, ``max_seq_len`` and ``record_messages`` are refused.

    Raises:
        ValueError: unknown env id, an env without tools, a reserved argument, a tool TRL cannot express.
        TypeError: not a chat env (``LLMTokens-v0``, ``LLMHashing-v0``).
    """
    import gymnasium as gym

    import gym_llm  # noqa: F401  (registers the ids)

    clash = sorted(set(env_kwargs) & set(_RESERVED))
    if clash:
        raise ValueError(f"environment_factory runs the env in text mode and sets {clash} itself; drop them from the "
                         "env arguments (TRL tokenizes with the trainer's processing_class).")
    if env_id not in gym.registry:
        known = sorted(k for k, spec in gym.registry.items() if str(spec.entry_point).startswith("gym_llm."))
        raise ValueError(f"Unknown env id {env_id!r}; expected a registered gym_llm env, one of {known}. Fix: check "
                         "the spelling, or import the module that registers your env first.")
    probe = gym.make(env_id, disable_env_checker=True, mode="text", **env_kwargs)
    try:
        return EnvironmentFactory(env_id, env_kwargs, probe)
    finally:
        probe.close()


def environment_reward(completions: Sequence[Any], environments: Sequence[GymLLMEnvironment] | None = None,
                       **kwargs: Any) -> list[float | None]:
    """TRL reward function: the env's episode return for each completion (``environments[i]._score(completions[i])``,
    see :meth:`GymLLMEnvironment._score`); None for an environment that is not a gym_llm one (another env of a
    multi-environment run). Logs ``env/replay_mismatch`` (the share of episodes whose replay ran a tool call TRL did
    not, or ended before TRL's conversation did)."""
    if environments is None:
        raise ValueError(
            "environment_reward scores the environments TRL passes as environments=; expected a GRPOTrainer with "
            "environment_factory=environment_factory(...), got none. Fix: pass environment_factory=, or use "
            "env_reward with EnvRolloutFunc."
        )
    if len(environments) != len(completions):
        raise ValueError(f"environment_reward: {len(environments)} environments for {len(completions)} completions.")
    out: list[float | None] = []
    mismatched = []
    for environment, completion in zip(environments, completions):
        if not isinstance(environment, GymLLMEnvironment):
            out.append(None)
            continue
        out.append(environment._score(completion))
        info = environment.last_info
        mismatched.append(float(bool(info.get("live_tool_calls") or info.get("extra_turns"))))
    log_metric = kwargs.get("log_metric")
    if callable(log_metric) and mismatched:
        log_metric("env/replay_mismatch", sum(mismatched) / len(mismatched))
    return out

