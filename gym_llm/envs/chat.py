"""``LLMChat-v0``: multi-turn chat with scripted or simulated user turns and a reward hook."""

from __future__ import annotations

from importlib import resources
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from gym_llm.core.chat import ChatConfig, ChatEpisode, Response
from gym_llm.core.env import LLMEnv
from gym_llm.envs.common import chat_env_parts
from gym_llm.core.episode import EnvParts
from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task, TaskOrder, tasks_from_records
from gym_llm.rewards.hooks import DEFAULT_HOOK_TIMEOUT_S, call_reward, check_hook, isolate_hook
from gym_llm.tasks.loading import load_records

__all__ = ["LLMChatEnv", "LLMChatVectorEnv", "ChatHandler", "RewardFn", "UserSimulator", "builtin_chat_prompts"]

RewardFn = Callable[[Task, Sequence[Message]], "float | tuple[float, Mapping[str, Any]]"]
"""``reward_fn(task, messages) -> reward`` or ``(reward, info)``; called after every assistant turn
with the conversation including that turn."""

UserSimulator = Callable[[Sequence[Message], Task], "str | None"]
"""``user_simulator(messages, task) -> next user message``, or ``None`` to end the conversation."""


def builtin_chat_prompts() -> list[dict[str, Any]]:
    """The small prompt set written for this project (24 prompts, some with scripted follow-ups)."""
    from gym_llm.tasks.loading import read_jsonl

    with resources.as_file(resources.files("gym_llm") / "data" / "chat_prompts.jsonl") as path:
        return read_jsonl(path)


_UNSCORED_END = Response(0.0, True, (), MappingProxyType({}))
"""How a conversation ends when there is no ``reward_fn``: one shared instance (a ``Response`` is frozen, this
one's info read-only), because building a frozen dataclass per step cost a sixth of a text-mode vector step."""


class ChatHandler:
    """After each assistant turn: reward from ``reward_fn``, then the next user message from the task's
    scripted ``follow_ups`` (or the env-wide ones), then from ``user_simulator``; none ends the episode."""

    def __init__(
        self,
        reward_fn: RewardFn | None = None,
        follow_ups: Sequence[str] | None = None,
        user_simulator: UserSimulator | None = None,
        reward_timeout_s: float | None = DEFAULT_HOOK_TIMEOUT_S,
    ):
        check_hook(reward_fn)
        check_hook(user_simulator, "user_simulator", "(messages, task) -> str | None")
        if follow_ups is not None and (isinstance(follow_ups, str) or not all(isinstance(f, str) for f in follow_ups)):
            raise TypeError("follow_ups must be a list of str (the user's scripted turns).")
        self.reward_fn = isolate_hook(reward_fn, reward_timeout_s)
        self.follow_ups = tuple(follow_ups or ())
        self.user_simulator = user_simulator

    def respond(self, episode: ChatEpisode, reply: Message) -> Response:
        messages = (*episode.messages, reply)
        reward, info = call_reward(self.reward_fn, episode.task, messages)
        index = episode.turn  # follow-up number for the turn being answered (0-based)
        script = episode.task.data.get("follow_ups") or self.follow_ups
        if index < len(script):
            next_user: str | None = script[index]
        elif self.user_simulator is not None:
            next_user = self.user_simulator(messages, episode.task)
            if next_user is not None and not isinstance(next_user, str):
                raise TypeError(f"user_simulator must return a str or None, got {type(next_user).__name__}.")
        else:
            next_user = None
        if next_user is None:
            return Response(reward, True, (), info) if self.reward_fn is not None else _UNSCORED_END
        return Response(reward, False, (Message("user", next_user),), info)


def build_chat(
    *,
    prompts: Any = None,
    split: str | None = None,
    follow_ups: Sequence[str] | None = None,
    user_simulator: UserSimulator | None = None,
    reward_fn: RewardFn | None = None,
    reward_timeout_s: float | None = DEFAULT_HOOK_TIMEOUT_S,
    task_order: TaskOrder = "shuffle",
    max_turns: int = 8,
    tools: Sequence[Any] | None = None,
    max_tool_calls_per_turn: int = 8,
    **chat_kwargs: Any,
) -> EnvParts:
    records = builtin_chat_prompts() if prompts is None else load_records(prompts, split=split)
    tasks = tasks_from_records(records)
    return chat_env_parts(tasks, ChatHandler(reward_fn, follow_ups, user_simulator, reward_timeout_s),
                          ChatConfig(max_turns=max_turns, **chat_kwargs), task_order=task_order, tools=tools,
                          max_tool_calls_per_turn=max_tool_calls_per_turn)


class LLMChatEnv(LLMEnv, build=build_chat):
    """Multi-turn chat.

    ## Description
    The policy plays the assistant. Each episode opens with a prompt (and the env's system prompt);
    after every assistant turn the user speaks again — a scripted follow-up from the task's
    ``follow_ups`` (or the env's ``follow_ups=``), else ``user_simulator(messages, task)`` — until the
    script runs out, the simulator returns ``None``, or ``max_turns`` is reached. With no arguments the
    env uses 24 built-in prompts written for this project, so ``gym.make("LLMChat-v0")`` just works.

    ## Action Space
    Text mode: ``UnicodeText(max_action_chars)`` — the assistant's reply. Tokens mode:
    ``Dict(input_ids=MultiDiscrete([V] * max_action_tokens), attention_mask=MultiBinary(...))`` — the
    sampled ids (the ids where the mask is 1); a plain 1-D int array or list is also accepted.

    ## Observation Space
    Text mode: ``UnicodeText(max_observation_chars)`` — the conversation rendered with the chat
    template, ending with the assistant generation prompt. Tokens mode:
    ``Dict(input_ids=MultiDiscrete([V] * max_seq_len), attention_mask=MultiBinary(max_seq_len))``,
    right-padded; ``info["policy_mask"]`` marks the sampled tokens.

    ## Rewards
    | event | reward |
    |---|---|
    | every assistant turn | ``reward_fn(task, messages)`` (default 0.0) |

    ## Starting State
    The task stream's next prompt (seeded shuffle by default; ``options={"task_id": i}`` forces one).

    ## Episode End
    Terminated when the user has nothing more to say. Truncated at ``max_turns`` assistant turns or
    when the conversation outgrows the observation space (both enforced by the env itself).

    ## Arguments
    ``prompts`` (list of str/records, a .jsonl path, or a ``datasets.Dataset``; records may hold
    ``prompt`` or ``messages`` and ``follow_ups``), ``split``, ``follow_ups``, ``user_simulator``,
    ``reward_fn``, ``task_order``, ``max_turns`` (default 8), ``tools`` (a list of
    :mod:`gym_llm.tools` tools — ``PythonTool``, ``MCPTool`` — whose calls in a reply are run and
    answered with ``tool`` messages; see ``docs/tools.md``), ``max_tool_calls_per_turn``, and every
    :class:`~gym_llm.core.chat.ChatConfig` field (``mode``, ``tokenizer``, ``system_prompt``, ...).

    ## Vectorized environment
    :class:`LLMChatVectorEnv` (``gym.make_vec("LLMChat-v0", num_envs=N, group_size=G)``).

    ## Version History
    * v0: initial version.
    """


LLMChatVectorEnv = LLMChatEnv.Vector
