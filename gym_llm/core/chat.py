"""The chat episode shared by every chat-style env (chat, GSM8K, IFEval, tools).

Text mode: the observation is the conversation rendered with the chat template up to the assistant's
generation prompt; the action is the assistant's reply as a string.

Tokens mode (needs a tokenizer): the observation is the token ids of the same prompt (padded, with an
attention mask); the action is the sampled token ids. The env appends the action's ids *verbatim*, and
renders and tokenises only the messages it adds itself (user follow-ups, tool results) — so an
episode's token sequence is exactly ``prompt + sampled + env + sampled + ...`` and
``info["policy_mask"]`` marks which positions the policy sampled (1) and which the env wrote (0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Protocol, Sequence

import numpy as np
from gymnasium import spaces

from gym_llm.core.actions import check_text_action, check_token_action
from gym_llm.core.episode import Episode, ForkError, Transition, fork_resource
from gym_llm.core.messages import Message
from gym_llm.core.spaces import UnicodeText, token_space
from gym_llm.core.tasks import Task
from gym_llm.core.templates import ChatRenderer
from gym_llm.core.tokenizer import TokenizerView

__all__ = ["ChatConfig", "ChatCommon", "ChatEpisode", "Response", "TurnHandler"]

Mode = Literal["text", "tokens"]
_CLOSING_TAIL_TOKENS = 8  # how many sampled tokens to decode when checking whether the turn was closed


@dataclass(frozen=True, kw_only=True)
class ChatConfig:
    """Settings shared by the chat-style envs.

    Attributes:
        mode: ``"text"`` (observations and actions are strings) or ``"tokens"`` (token ids; needs
            ``tokenizer``).
        tokenizer: any object with ``encode``/``decode`` (and ``apply_chat_template`` to use its own
            template), e.g. a Hugging Face tokenizer. Optional in text mode.
        vocab_size: V for the token spaces; default ``len(tokenizer)``. Set it to the model's embedding
            size when that is larger, so every id the model can sample is admitted.
        chat_template: a jinja2 template string overriding the tokenizer's (default: the tokenizer's
            own template, else the built-in ChatML).
        template_kwargs: extra template variables, e.g. ``{"enable_thinking": False}`` for Qwen3.
        system_prompt: prepended as a system message unless the task brings its own.
        max_turns: assistant turns per episode; reaching it with the conversation unfinished truncates.
        max_action_chars: text mode: the longest accepted reply (longer raises ``ValueError``).
        max_observation_chars: text mode: the longest observation; a longer one truncates the episode.
        max_action_tokens: tokens mode: the longest accepted reply in tokens (longer raises).
        max_seq_len: tokens mode: L, the observation length; a conversation that outgrows it truncates.
        record_messages: add ``info["messages"]`` to the last step of every episode (terminated or
            truncated): the whole conversation as a JSON list of ``{"role", "content", ...}`` dicts
            (:meth:`Message.to_dict`), e.g. to export rollouts as conversational SFT data. Off by default
            (it costs one ``json.dumps`` per episode).
    """

    mode: Mode = "text"
    tokenizer: Any = None
    vocab_size: int | None = None
    chat_template: str | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None
    max_turns: int = 1
    max_action_chars: int = 16_384
    max_observation_chars: int = 131_072
    max_action_tokens: int = 2_048
    max_seq_len: int = 8_192
    record_messages: bool = False

    def __post_init__(self) -> None:
        if self.mode not in ("text", "tokens"):
            raise ValueError(f"mode must be 'text' or 'tokens', got {self.mode!r}.")
        if self.mode == "tokens" and self.tokenizer is None:
            raise ValueError(
                "mode='tokens' needs a tokenizer (any object with encode/decode, e.g. "
                "transformers.AutoTokenizer.from_pretrained(...)); pass tokenizer=..., or use mode='text'."
            )
        for name in ("max_turns", "max_action_chars", "max_observation_chars", "max_action_tokens", "max_seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        if self.mode == "tokens" and self.max_action_tokens > self.max_seq_len:
            raise ValueError(
                f"max_action_tokens={self.max_action_tokens} exceeds max_seq_len={self.max_seq_len}; "
                "raise max_seq_len or lower max_action_tokens."
            )
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise TypeError(f"system_prompt must be a str or None, got {type(self.system_prompt).__name__}.")


@dataclass(frozen=True, slots=True)
class Response:
    """The env's answer to one assistant turn.

    Attributes:
        reward: this turn's reward.
        done: the episode ends here (terminated).
        messages: when not done, the messages the env adds (user follow-up, tool results).
        info: extra per-step info (flattened into the step's ``info``).
    """

    reward: float = 0.0
    done: bool = True
    messages: tuple[Message, ...] = ()
    info: Mapping[str, Any] = field(default_factory=dict)


class TurnHandler(Protocol):
    """Decides what happens after each assistant turn (scoring, follow-ups, tools).

    ``respond`` must not change the episode; it may be called from a worker thread. Optional
    ``start(episode)`` / ``close(episode)`` methods manage per-episode resources.
    """

    def respond(self, episode: "ChatEpisode", reply: Message) -> Response: ...


class ChatCommon:
    """Everything the chat episodes of one env share: config, renderer, tokenizer, handler, caches."""

    def __init__(self, config: ChatConfig, handler: TurnHandler, *, tools: Sequence[Mapping[str, Any]] | None = None):
        self.config = config
        self.handler = handler
        self.renderer = ChatRenderer(config.tokenizer, config.chat_template, config.template_kwargs, tools)
        self.tokenizer = TokenizerView(config.tokenizer, config.vocab_size) if config.tokenizer is not None else None
        self.system = Message("system", config.system_prompt) if config.system_prompt else None
        self._prompt_cache: dict[int, tuple[Task, tuple[tuple[Message, ...], Any]]] = {}
        self.start_hook = getattr(handler, "start", None)
        self.close_hook = getattr(handler, "close", None)
        if config.mode == "text":
            self.observation_space: spaces.Space = UnicodeText(config.max_observation_chars)
            self.action_space: spaces.Space = UnicodeText(config.max_action_chars)
        else:
            vocab = self.tokenizer.vocab_size
            self.observation_space = token_space(vocab, config.max_seq_len)
            self.action_space = token_space(vocab, config.max_action_tokens)

    def opening(self, task: Task) -> tuple[Message, ...]:
        if self.system is not None and not (task.messages and task.messages[0].role == "system"):
            return (self.system, *task.messages)
        return task.messages

    def opening_prompt(self, task: Task) -> tuple[tuple[Message, ...], Any]:
        """The task's opening messages and their rendered (text mode) or tokenised (tokens mode) prompt.

        Cached per task object (sub-envs share the cache), so a task's prompt is rendered once.

        Raises:
            ValueError: the prompt does not fit the observation (``max_observation_chars``/``max_seq_len``).
        """
        cached = self._prompt_cache.get(id(task))
        if cached is not None and cached[0] is task:
            return cached[1]
        messages = self.opening(task)
        text = self.renderer.render(messages, add_generation_prompt=True)
        if self.config.mode == "text":
            prompt = text
            if len(prompt) > self.config.max_observation_chars:
                raise ValueError(
                    f"Task {task.task_id}'s rendered prompt has {len(prompt)} characters, more than "
                    f"max_observation_chars={self.config.max_observation_chars}; raise max_observation_chars."
                )
        else:
            prompt = np.asarray(self.tokenizer.encode(text), dtype=np.int64)
            if len(prompt) > self.config.max_seq_len:
                raise ValueError(
                    f"Task {task.task_id}'s prompt has {len(prompt)} tokens, more than "
                    f"max_seq_len={self.config.max_seq_len}; raise max_seq_len."
                )
        if len(self._prompt_cache) >= 65_536:
            self._prompt_cache.clear()
        self._prompt_cache[id(task)] = (task, (messages, prompt))
        return messages, prompt

    def new_episode(self) -> "ChatEpisode":
        return ChatEpisode(self)


_Reply = tuple[Message, "np.ndarray | None"]
"""A checked action: the reply as a message and, in tokens mode, its token ids (a plain tuple: the vector
env builds one per sample, and a dataclass instance costs several times more)."""


class ChatEpisode(Episode):
    """One chat conversation. See the module docstring for the text and tokens modes.

    Attributes:
        task: the current task.
        messages: the conversation so far (system, user, assistant, tool, ...).
        turn: assistant turns taken.
        token_ids: tokens mode: the full sequence so far, ``(n,)`` int64.
        policy_mask: tokens mode: ``(n,)`` int8, 1 where the policy sampled the token.
        resources: per-episode objects owned by the handler (e.g. a sandbox).
    """

    def __init__(self, common: ChatCommon):
        self.common = common
        self.config = common.config
        self.task: Task | None = None
        self.messages: list[Message] = []
        self.turn = 0
        self.resources: dict[str, Any] = {}
        self._open = False  # the handler's start() ran and close() has not yet
        self._text_mode = self.config.mode == "text"  # read on every step
        self._text = ""
        L = self.config.max_seq_len if self.config.mode == "tokens" else 0
        self._ids = np.zeros(L, dtype=np.int64)
        self._mask = np.zeros(L, dtype=np.int8)
        self._n = 0

    # --------------------------------------------------------------------------------- views
    @property
    def token_ids(self) -> np.ndarray:
        return self._ids[: self._n].copy()

    @property
    def policy_mask(self) -> np.ndarray:
        return self._mask[: self._n].copy()

    def _observation(self) -> Any:
        if self._text_mode:
            return self._text
        L = self.config.max_seq_len
        attention = np.zeros(L, dtype=np.int8)
        attention[: self._n] = 1
        return {"input_ids": self._ids.copy(), "attention_mask": attention}

    def _info(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        info: dict[str, Any] = {"turn": self.turn}
        if not self._text_mode:
            info["policy_mask"] = self._mask.copy()
        if extra:
            info.update(extra)
        return info

    # ------------------------------------------------------------------------------ episode
    def start(self, task: Task) -> tuple[Any, dict[str, Any]]:
        if self._open:
            self.close()
        opening, prompt = self.common.opening_prompt(task)
        if self._text_mode:
            self._text = prompt
        else:
            self._n = len(prompt)
            self._ids[:] = 0
            self._ids[: self._n] = prompt
            self._mask[:] = 0
        self.task = task
        self.messages = list(opening)
        self.turn = 0
        if self.common.start_hook is not None:
            self.common.start_hook(self)
        self._open = True
        if self._text_mode:
            return prompt, {"turn": 0}
        return self._observation(), self._info()

    def check_action(self, action: Any) -> _Reply:
        if self._text_mode:
            return Message("assistant", check_text_action(action, self.config.max_action_chars)), None
        ids = check_token_action(action, self.common.tokenizer.vocab_size, self.config.max_action_tokens)
        return Message("assistant", self.common.tokenizer.decode(ids)), ids

    def respond(self, action: _Reply) -> Response:
        response = self.common.handler.respond(self, action[0])
        if not isinstance(response, Response):
            raise TypeError(f"A TurnHandler must return a gym_llm Response, got {type(response).__name__}.")
        return response

    def advance(self, action: _Reply, response: Response) -> Transition:
        reply, ids = action
        self.messages.append(reply)
        self.turn += 1
        terminated = bool(response.done)
        truncated = not terminated and self.turn >= self.config.max_turns
        if self._text_mode:
            observation, overflow = self._advance_text(reply.content, response, terminated or truncated)
        else:
            observation, overflow = self._advance_tokens(ids, response, terminated or truncated)
        truncated = truncated or overflow
        transition = Transition(observation, float(response.reward), terminated, truncated, self._info(response.info))
        if terminated or truncated:
            if self.config.record_messages:
                transition.info["messages"] = json.dumps([m.to_dict() for m in self.messages], ensure_ascii=False)
            self.close()  # free per-episode resources (a sandbox, a browser context) as soon as it ends
        return transition

    def _advance_text(self, reply: str, response: Response, ended: bool) -> tuple[str, bool]:
        """The next observation, and whether the conversation outgrew the observation space (which
        truncates it; the observation is then the last prompt plus the reply, as when it ends)."""
        if not ended:
            self.messages.extend(response.messages)
            text = self.common.renderer.render(self.messages, add_generation_prompt=True)
            if len(text) <= self.config.max_observation_chars:
                self._text = text
                return text, False
        self._text = (self._text + reply)[: self.config.max_observation_chars]
        return self._text, not ended

    def _advance_tokens(self, ids: np.ndarray, response: Response,
                        ended: bool) -> tuple[dict[str, np.ndarray], bool]:
        """The next observation, and whether the sequence outgrew ``max_seq_len`` (which truncates it)."""
        L = self.config.max_seq_len
        k = min(len(ids), L - self._n)
        self._ids[self._n: self._n + k] = ids[:k]
        self._mask[self._n: self._n + k] = 1
        self._n += k
        overflow = k < len(ids) and not ended
        if not (ended or overflow):
            new_ids = self._continuation_ids(ids, response.messages)
            if self._n + len(new_ids) <= L:
                self.messages.extend(response.messages)
                self._ids[self._n: self._n + len(new_ids)] = new_ids
                self._n += len(new_ids)
            else:
                overflow = True  # the env's turn does not fit in max_seq_len
        return self._observation(), overflow

    def _continuation_ids(self, sampled: np.ndarray, new_messages: Sequence[Message]) -> list[int]:
        """Token ids the env appends after the policy's sampled ids: the rest of the assistant turn's
        closing that the policy did not sample (e.g. the ``\\n`` after ``<|im_end|>``), then the new
        messages and the next generation prompt."""
        closing = self.common.renderer.closing
        tokenizer = self.common.tokenizer
        tail = tokenizer.decode(sampled[-_CLOSING_TAIL_TOKENS:], skip_special_tokens=False) if len(sampled) else ""
        done = next((k for k in range(len(closing), 0, -1) if tail.endswith(closing[:k])), 0)
        system = self.messages[0] if self.messages and self.messages[0].role == "system" else None
        text = closing[done:] + self.common.renderer.render_continuation(new_messages, system=system)
        return self.common.tokenizer.encode(text)

    def render(self) -> str:
        if self.config.mode == "tokens":
            return self.common.tokenizer.decode(self._ids[: self._n], skip_special_tokens=False)
        return self.common.renderer.render(self.messages, add_generation_prompt=False)

    def fork(self) -> "ChatEpisode":
        """An independent sibling at this turn (see :meth:`Episode.fork`): the conversation, token buffers and
        turn are copied; each per-episode resource is forked (a Python tool's REPL with its variables and files,
        see :meth:`gym_llm.tools.python.PythonSession.fork`) or refused with a :class:`ForkError` naming it
        (a browser, an MCP server, an MLGym workspace), in which case nothing was forked."""
        if self.task is None:
            raise ForkError("fork() needs an episode: call reset() first.")
        resources: dict[str, Any] = {}
        try:
            for key, value in self.resources.items():
                resources[key] = fork_resource(value, f"this episode's resource {key!r}")
        except BaseException:
            for value in resources.values():
                close = getattr(value, "close", None)
                if callable(close):
                    close()
            raise
        sibling = object.__new__(type(self))
        sibling.__dict__.update(self.__dict__)
        sibling.messages = list(self.messages)
        sibling._ids, sibling._mask = self._ids.copy(), self._mask.copy()
        sibling.resources = resources
        return sibling

    def close(self) -> None:
        """Release the handler's per-episode resources (idempotent)."""
        if self._open:
            self._open = False
            if self.common.close_hook is not None:
                self.common.close_hook(self)
