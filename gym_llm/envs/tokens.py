"""``LLMTokens-v0``: the generic token (or text) concatenation env."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import numpy as np
from gymnasium import spaces

from gym_llm.rewards.deadline import DEFAULT_HOOK_TIMEOUT_S, DeadlineExceeded, isolate_hook
from gym_llm.core.actions import check_text_action, check_token_action
from gym_llm.core.chat import ChatConfig
from gym_llm.core.episode import EnvParts, Episode, ForkError, Transition
from gym_llm.core.env import LLMEnv
from gym_llm.core.messages import Message
from gym_llm.core.spaces import UnicodeText, token_space
from gym_llm.core.tasks import Task, TaskOrder
from gym_llm.core.templates import ChatRenderer
from gym_llm.core.tokenizer import TokenizerView
from gym_llm.tasks.loading import load_records

__all__ = ["LLMTokensEnv", "LLMTokensVectorEnv", "TokensConfig", "TokensEpisode"]

SequenceRewardFn = Callable[[Task, Any, bool], float]
"""``reward_fn(task, sequence, done) -> float``: ``sequence`` is the full token id array (tokens mode)
or text (text mode) after the step; called every step."""


@dataclass(frozen=True, kw_only=True)
class TokensConfig:
    """Settings of ``LLMTokens-v0``.

    Attributes:
        mode: ``"tokens"`` (default when a tokenizer or vocab_size is given) or ``"text"``.
        tokenizer: encodes text prompts and decodes for ``render``; optional if prompts are token ids
            and ``vocab_size`` is given.
        vocab_size: V; default ``len(tokenizer)``.
        eos_token_ids: ids that end the episode when sampled (default: the tokenizer's eos).
        stop_strings: text mode: strings that end the episode when they appear in an action.
        apply_chat_template: wrap text prompts as a user message and render with the chat template
            (default: use the prompt text as is).
        max_seq_len: tokens mode: L, the observation length.
        max_action_tokens: tokens mode: the longest accepted action.
        max_chars: text mode: the longest observation and action.
        max_steps: steps per episode before truncation (None: only length and eos end it).
        reward_fn: ``reward_fn(task, sequence, done) -> float`` (default 0.0), run in a deadline worker process.
        reward_timeout_s: ``reward_fn``'s deadline in seconds: past it the step's reward is 0 and
            ``info["reward_error"]`` says why (``None``: call it in the env's thread, no deadline; see
            :class:`~gym_llm.rewards.deadline.IsolatedHook`).
    """

    mode: Literal["tokens", "text"] | None = None
    tokenizer: Any = None
    vocab_size: int | None = None
    eos_token_ids: Sequence[int] | None = None
    stop_strings: Sequence[str] = ()
    apply_chat_template: bool = False
    max_seq_len: int = 4_096
    max_action_tokens: int = 1_024
    max_chars: int = 65_536
    max_steps: int | None = None
    reward_fn: SequenceRewardFn | None = None
    reward_timeout_s: float | None = DEFAULT_HOOK_TIMEOUT_S

    def resolved_mode(self) -> str:
        if self.mode is not None:
            if self.mode not in ("tokens", "text"):
                raise ValueError(f"mode must be 'tokens' or 'text', got {self.mode!r}.")
            return self.mode
        return "tokens" if (self.tokenizer is not None or self.vocab_size is not None) else "text"


class _TokensCommon:
    """Shared state of one ``LLMTokens-v0`` env (config, tokenizer, spaces)."""

    def __init__(self, config: TokensConfig):
        self.config = config
        self.mode = config.resolved_mode()
        self.reward_fn = isolate_hook(config.reward_fn, config.reward_timeout_s)
        self.tokenizer = TokenizerView(config.tokenizer, config.vocab_size) if config.tokenizer is not None else None
        # ChatConfig validates the shared length limits with the same messages as the chat envs.
        ChatConfig(max_action_tokens=config.max_action_tokens, max_seq_len=config.max_seq_len,
                   max_action_chars=config.max_chars, max_observation_chars=config.max_chars)
        if self.mode == "tokens":
            vocab = self.tokenizer.vocab_size if self.tokenizer is not None else config.vocab_size
            if vocab is None:
                raise ValueError("Tokens mode needs tokenizer= or vocab_size=.")
            self.vocab_size = int(vocab)
            eos = config.eos_token_ids if config.eos_token_ids is not None else (
                self.tokenizer.eos_token_ids if self.tokenizer is not None else ())
            self.eos = np.array(sorted(eos), dtype=np.int64)
            self.observation_space: spaces.Space = token_space(self.vocab_size, config.max_seq_len)
            self.action_space: spaces.Space = token_space(self.vocab_size, config.max_action_tokens)
        else:
            self.observation_space = UnicodeText(config.max_chars)
            self.action_space = UnicodeText(config.max_chars)
        self.renderer = ChatRenderer(config.tokenizer) if config.apply_chat_template else None
        self._cache: dict[int, Any] = {}

    def prompt(self, task: Task) -> Any:
        cached = self._cache.get(id(task))
        if cached is not None and cached[0] is task:
            return cached[1]
        token_ids = task.data.get("token_ids") if isinstance(task.data, dict) else None
        if token_ids is not None:
            if self.mode == "text":
                if self.tokenizer is None:
                    raise ValueError("Token-id prompts in text mode need a tokenizer to decode them.")
                value: Any = self.tokenizer.decode(token_ids, skip_special_tokens=False)
            else:
                value = np.asarray(token_ids, dtype=np.int64)
        else:
            text = task.prompt
            if self.renderer is not None:
                text = self.renderer.render(task.messages, add_generation_prompt=True)
            if self.mode == "text":
                value = text
            elif self.tokenizer is None:
                raise ValueError("Text prompts in tokens mode need tokenizer= to encode them.")
            else:
                value = np.asarray(self.tokenizer.encode(text), dtype=np.int64)
        self._cache[id(task)] = (task, value)
        return value


class TokensEpisode(Episode):
    """One concatenation episode: ``sequence = prompt + action_1 + action_2 + ...``."""

    def __init__(self, common: _TokensCommon):
        self.common = common
        self.config = common.config
        self.task: Task | None = None
        self.steps = 0
        L = self.config.max_seq_len if common.mode == "tokens" else 0
        self._ids = np.zeros(L, dtype=np.int64)
        self._mask = np.zeros(L, dtype=np.int8)
        self._n = 0
        self._text = ""

    def _observation(self) -> Any:
        if self.common.mode == "text":
            return self._text
        attention = np.zeros(self.config.max_seq_len, dtype=np.int8)
        attention[: self._n] = 1
        return {"input_ids": self._ids.copy(), "attention_mask": attention}

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"steps": self.steps}
        if self.common.mode == "tokens":
            info["policy_mask"] = self._mask.copy()
        return info

    def start(self, task: Task) -> tuple[Any, dict[str, Any]]:
        prompt = self.common.prompt(task)
        if self.common.mode == "tokens":
            if len(prompt) > self.config.max_seq_len:
                raise ValueError(f"Task {task.task_id}'s prompt has {len(prompt)} tokens > max_seq_len={self.config.max_seq_len}.")
            if len(prompt) and (prompt.min() < 0 or prompt.max() >= self.common.vocab_size):
                raise ValueError(f"Task {task.task_id}'s prompt has token ids outside [0, {self.common.vocab_size}).")
            self._ids[:] = 0
            self._ids[: len(prompt)] = prompt
            self._mask[:] = 0
            self._n = len(prompt)
        else:
            if len(prompt) > self.config.max_chars:
                raise ValueError(f"Task {task.task_id}'s prompt has {len(prompt)} characters > max_chars={self.config.max_chars}.")
            self._text = prompt
        self.task = task
        self.steps = 0
        return self._observation(), self._info()

    def check_action(self, action: Any) -> Any:
        if self.common.mode == "text":
            return check_text_action(action, self.config.max_chars)
        return check_token_action(action, self.common.vocab_size, self.config.max_action_tokens)

    def advance(self, action: Any, response: Any) -> Transition:
        self.steps += 1
        if self.common.mode == "text":
            room = self.config.max_chars - len(self._text)
            self._text += action[:room]
            hit_stop = any(s in action for s in self.config.stop_strings)
            overflow = len(action) > room or len(self._text) >= self.config.max_chars
            sequence: Any = self._text
        else:
            room = self.config.max_seq_len - self._n
            k = min(room, len(action))
            self._ids[self._n: self._n + k] = action[:k]
            self._mask[self._n: self._n + k] = 1
            self._n += k
            hit_stop = bool(len(self.common.eos) and np.isin(action, self.common.eos).any())
            overflow = len(action) > room or self._n >= self.config.max_seq_len
            sequence = self._ids[: self._n].copy()
        terminated = hit_stop
        truncated = not terminated and (overflow or (self.config.max_steps is not None and self.steps >= self.config.max_steps))
        reward, info = 0.0, self._info()
        if self.common.reward_fn is not None:
            try:
                reward = float(self.common.reward_fn(self.task, sequence, terminated or truncated))
            except DeadlineExceeded as e:  # the hook ran past its deadline: fail closed, and say so
                info["reward_error"] = f"DeadlineExceeded: {e}"
        return Transition(self._observation(), reward, terminated, truncated, info)

    def fork(self) -> "TokensEpisode":
        """An independent sibling at this step (see :meth:`Episode.fork`): the sequence so far is copied."""
        if self.task is None:
            raise ForkError("fork() needs an episode: call reset() first.")
        sibling = object.__new__(type(self))
        sibling.__dict__.update(self.__dict__)
        sibling._ids, sibling._mask = self._ids.copy(), self._mask.copy()
        return sibling

    def render(self) -> str:
        if self.common.mode == "text":
            return self._text
        if self.common.tokenizer is None:
            return " ".join(map(str, self._ids[: self._n].tolist()))
        return self.common.tokenizer.decode(self._ids[: self._n], skip_special_tokens=False)


def _tokens_tasks(prompts: Any, split: str | None) -> list[Task]:
    records = load_records(prompts, split=split)
    tasks = []
    for index, record in enumerate(records):
        if isinstance(record, str):
            tasks.append(Task(index, (Message("user", record),), None, {"prompt": record}))
        elif isinstance(record, dict) and ("prompt" in record or "token_ids" in record):
            text = record.get("prompt", "")
            tasks.append(Task(index, (Message("user", str(text)),), record.get("answer"), record))
        elif isinstance(record, (list, tuple, np.ndarray)) and all(isinstance(t, (int, np.integer)) for t in record):
            tasks.append(Task(index, (Message("user", ""),), None, {"token_ids": [int(t) for t in record]}))
        else:
            raise ValueError(
                f"LLMTokens prompt {index} must be a str, a list of token ids, or a record with 'prompt' or "
                f"'token_ids'; got {type(record).__name__}."
            )
    return tasks


_DEFAULT_PROMPTS = ("Once upon a time,", "The quick brown fox", "In a distant galaxy,", "def fibonacci(n):")


def build_tokens(*, prompts: Any = None, split: str | None = None, task_order: TaskOrder = "shuffle",
                 **kwargs: Any) -> EnvParts:
    common = _TokensCommon(TokensConfig(**kwargs))
    if prompts is None:
        prompts = list(_DEFAULT_PROMPTS)
    return EnvParts(
        tasks=_tokens_tasks(prompts, split),
        new_episode=lambda: TokensEpisode(common),
        observation_space=common.observation_space,
        action_space=common.action_space,
        task_order=task_order,
    )


class LLMTokensEnv(LLMEnv, build=build_tokens):
    """Generic token (or text) concatenation env — the base for language-model rollouts without chat.

    ## Description
    The observation is the sequence so far; each action is appended to it verbatim. Prompts are text
    (encoded with the tokenizer; optionally wrapped in the chat template) or token-id lists.

    ## Action Space
    Tokens mode: ``Dict(input_ids=MultiDiscrete([V] * max_action_tokens), attention_mask=MultiBinary)``
    (or a 1-D int array/list). Text mode: ``UnicodeText(max_chars)``.

    ## Observation Space
    Tokens mode: ``Dict(input_ids=MultiDiscrete([V] * max_seq_len), attention_mask=MultiBinary)``,
    right-padded; ``info["policy_mask"]`` marks the appended (policy) tokens. Text mode: ``UnicodeText``.

    ## Rewards
    | event | reward |
    |---|---|
    | every step | ``reward_fn(task, sequence, done)`` (default 0.0) |

    ## Starting State
    The next prompt of the task stream.

    ## Episode End
    Terminated when an action contains an eos id (tokens) or a stop string (text). Truncated when the
    sequence reaches ``max_seq_len``/``max_chars`` or after ``max_steps`` steps.

    ## Arguments
    ``prompts`` (list of str / token-id lists / records, a .jsonl path, a ``datasets.Dataset``; default:
    four built-in story openings), ``split``, ``task_order``, and the :class:`TokensConfig` fields.

    ## Vectorized environment
    :class:`LLMTokensVectorEnv`.

    ## Version History
    * v0: initial version.
    """


LLMTokensVectorEnv = LLMTokensEnv.Vector
