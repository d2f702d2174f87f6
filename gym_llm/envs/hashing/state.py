"""The batched state behind ``LLMHashing-v0``: N token chains in numpy arrays, with their hashes and text.

:class:`TokenChains` holds every row of a vector env (a scalar env is the ``N = 1`` case), so one step
of all sub-envs is a handful of numpy operations on ``(N,)`` and ``(N, L)`` arrays — no Python loop
over sub-envs except to decode text and to restart the rows whose episodes ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from gymnasium import spaces

from gym_llm.core.messages import Message
from gym_llm.core.spaces import UnicodeText, token_space
from gym_llm.core.tasks import Task
from gym_llm.core.templates import ChatRenderer
from gym_llm.core.tokenizer import TokenizerView
from gym_llm.envs.hashing.chain_hash import HASH_SEED, chain_hash
from gym_llm.rewards.deadline import DEFAULT_HOOK_TIMEOUT_S, isolate_hook

_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_M1, _M2, _PHI = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)
from gym_llm.envs.detok import IncrementalDetokenizer

__all__ = ["HashingConfig", "HashingCommon", "HashingState", "TokenChains"]

TerminalRewardFn = Callable[[Task, np.ndarray, int], float]
"""``reward_fn(task, token_ids, prompt_length) -> float``, called once when an episode ends, with the
chain's full ``(n,)`` ids (the generated tokens are ``token_ids[prompt_length:]``)."""


@dataclass(frozen=True, kw_only=True)
class HashingConfig:
    """Settings of ``LLMHashing-v0``.

    Attributes:
        tokenizer: encodes text prompts and decodes text output; optional with token-id prompts and
            ``vocab_size``.
        vocab_size: V, the action space size (default ``len(tokenizer)``; pass the model's embedding
            size when it is larger).
        max_seq_len: L, the observation length (prompt + generated tokens).
        max_new_tokens: generated tokens per episode before truncation (None: only ``max_seq_len``).
        eos_token_ids: ids that terminate the episode (default: the tokenizer's eos; ``()`` for none).
        text_output: add ``"text"`` (decoded incrementally) to the observation; needs a tokenizer.
        max_text_chars: the text space's length; a longer text truncates the episode (default 64 L).
        apply_chat_template: render text prompts as a user turn with the chat template.
        hash_seed: the hash of the empty sequence (see :mod:`gym_llm.envs.hashing.chain_hash`).
        reward_fn: ``reward_fn(task, token_ids, prompt_length) -> float`` at episode end (default: 0), run in a
            deadline worker process.
        reward_timeout_s: ``reward_fn``'s deadline in seconds: past it the reward is 0 and ``info["reward_error"]``
            says why (``None``: call it in the env's thread, no deadline; see
            :class:`~gym_llm.rewards.deadline.IsolatedHook`).
    """

    tokenizer: Any = None
    vocab_size: int | None = None
    max_seq_len: int = 1024
    max_new_tokens: int | None = None
    eos_token_ids: Sequence[int] | None = None
    text_output: bool = False
    max_text_chars: int | None = None
    apply_chat_template: bool = False
    hash_seed: int = HASH_SEED
    reward_fn: TerminalRewardFn | None = None
    reward_timeout_s: float | None = DEFAULT_HOOK_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("max_seq_len", "max_new_tokens", "max_text_chars", "vocab_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        if self.text_output and self.tokenizer is None:
            raise ValueError("text_output=True needs tokenizer= to decode tokens; pass one or set text_output=False.")
        if self.reward_fn is not None and not callable(self.reward_fn):
            raise TypeError(f"reward_fn must be callable(task, token_ids, prompt_length) -> float, got {type(self.reward_fn).__name__}.")
        if not isinstance(self.hash_seed, (int, np.integer)) or not 0 <= self.hash_seed < 2**64:
            raise ValueError(f"hash_seed must be an int in [0, 2**64), got {self.hash_seed!r}.")


@dataclass(frozen=True, slots=True)
class HashingState:
    """A snapshot of one episode, for tree search: restore it to branch from this node.

    Attributes:
        token_ids: the chain so far, ``(n,)`` int64 (read-only).
        prompt_length: how many of those are the prompt.
        hash: the chain hash of ``token_ids`` (Python int in ``[0, 2**64)``).
        steps: tokens generated since the prompt.
        done: the episode had ended (a restored env then needs ``reset``).
        task: the episode's task.
        text: the text and the incremental decoder's state (:meth:`IncrementalDetokenizer.state
            <gym_llm.envs.detok.IncrementalDetokenizer.state>`), or None.
        signature: the env settings the state fits (vocab size, length, text, hash seed).
    """

    token_ids: np.ndarray
    prompt_length: int
    hash: int
    steps: int
    done: bool
    task: Task
    text: tuple | None
    signature: tuple = field(repr=False)


class HashingCommon:
    """What all rows share: config, spaces, eos lookup table, prompt cache."""

    def __init__(self, config: HashingConfig):
        self.config = config
        self.reward_fn = isolate_hook(config.reward_fn, config.reward_timeout_s)
        self.tokenizer = TokenizerView(config.tokenizer, config.vocab_size) if config.tokenizer is not None else None
        vocab = self.tokenizer.vocab_size if self.tokenizer is not None else config.vocab_size
        if vocab is None:
            raise ValueError("LLMHashing needs tokenizer= or vocab_size= (the number of token ids).")
        self.vocab_size = int(vocab)
        self.max_seq_len = int(config.max_seq_len)
        eos = config.eos_token_ids if config.eos_token_ids is not None else (
            self.tokenizer.eos_token_ids if self.tokenizer is not None else ())
        # (V,) uint64: (t + 1) * phi mod 2**64, the per-token key of the chain hash (8 bytes per id)
        self.token_keys = (np.arange(1, self.vocab_size + 1, dtype=np.uint64) * _PHI)
        self.is_eos = np.zeros(self.vocab_size, dtype=bool)  # lookup table: is_eos[token]
        for token in eos:
            if not 0 <= int(token) < self.vocab_size:
                raise ValueError(f"eos token id {token} is outside the vocabulary [0, {self.vocab_size}).")
            self.is_eos[int(token)] = True
        self.has_eos = bool(self.is_eos.any())
        self.max_new_tokens = config.max_new_tokens if config.max_new_tokens is not None else self.max_seq_len
        self.max_text_chars = config.max_text_chars if config.max_text_chars is not None else 64 * self.max_seq_len
        obs = dict(token_space(self.vocab_size, self.max_seq_len).spaces)
        obs["hash"] = spaces.Box(0, np.iinfo(np.uint64).max, shape=(1,), dtype=np.uint64)  # 1-d: SB3 and TorchRL need it
        if config.text_output:
            obs["text"] = UnicodeText(self.max_text_chars)
        self.observation_space = spaces.Dict(obs)
        self.action_space = spaces.Discrete(self.vocab_size)
        self.signature = (self.vocab_size, self.max_seq_len, bool(config.text_output), int(config.hash_seed))
        self.renderer = ChatRenderer(config.tokenizer) if config.apply_chat_template else None
        self._prompts: dict[int, tuple[Task, np.ndarray, np.uint64, Any]] = {}
        self._decoder = IncrementalDetokenizer(config.tokenizer, 1) if config.text_output else None

    def prompt(self, task: Task) -> tuple[np.ndarray, np.uint64, Any]:
        """The task's prompt ids ``(n,)``, their chain hash and (text mode) ``(text, decoder context)``;
        cached per task."""
        cached = self._prompts.get(id(task))
        if cached is not None and cached[0] is task:
            return cached[1], cached[2], cached[3]
        ids = self._prompt_ids(task)
        if len(ids) >= self.max_seq_len:
            raise ValueError(
                f"Task {task.task_id}'s prompt has {len(ids)} tokens; max_seq_len={self.max_seq_len} leaves no room "
                "to generate. Raise max_seq_len."
            )
        if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"Task {task.task_id}'s prompt has token ids outside [0, {self.vocab_size}).")
        ids.setflags(write=False)
        text = None
        if self._decoder is not None:
            text = self._decoder.prompt(ids.tolist())
            if len(text[0]) >= self.max_text_chars:
                raise ValueError(
                    f"Task {task.task_id}'s prompt decodes to {len(text[0])} characters; max_text_chars="
                    f"{self.max_text_chars} leaves no room to generate. Raise max_text_chars."
                )
        value = (task, ids, np.uint64(chain_hash(ids, self.config.hash_seed)), text)
        if len(self._prompts) >= 65_536:
            self._prompts.clear()
        self._prompts[id(task)] = value
        return value[1], value[2], value[3]

    def _prompt_ids(self, task: Task) -> np.ndarray:
        token_ids = task.data.get("token_ids") if isinstance(task.data, dict) else None
        if token_ids is not None:
            return np.array(token_ids, dtype=np.int64)
        if self.tokenizer is None:
            raise ValueError(f"Task {task.task_id} is text; encoding it needs tokenizer= (or give token-id prompts).")
        text = task.prompt
        if self.renderer is not None:
            text = self.renderer.render((Message("user", text),), add_generation_prompt=True)
        return np.array(self.tokenizer.encode(text), dtype=np.int64)


class TokenChains:
    """N token chains (right-padded ``(N, L)`` ids, lengths, hashes, step counts, optional text)."""

    def __init__(self, common: HashingCommon, num_rows: int):
        self.common = common
        N, L = num_rows, common.max_seq_len
        self.ids = np.zeros((N, L), dtype=np.int64)
        self.mask = np.zeros((N, L), dtype=np.int8)
        self.lengths = np.zeros(N, dtype=np.int64)
        self.prompt_lengths = np.zeros(N, dtype=np.int64)
        self.hashes = np.full(N, common.config.hash_seed, dtype=np.uint64)
        self.steps = np.zeros(N, dtype=np.int64)
        self.remaining = np.zeros(N, dtype=np.int64)  # min(L - length, max_new_tokens - steps)
        self.decoder = IncrementalDetokenizer(common.config.tokenizer, N) if common.config.text_output else None
        self._all_rows = np.arange(N)
        self._row_offsets = self._all_rows * L
        self._ids_flat, self._mask_flat = self.ids.reshape(-1), self.mask.reshape(-1)  # views

    # ---------------------------------------------------------------------------- one row
    def start(self, row: int, task: Task) -> None:
        ids, prompt_hash, text = self.common.prompt(task)
        n = len(ids)
        self.ids[row] = 0
        self.ids[row, :n] = ids
        self.mask[row] = 0
        self.mask[row, :n] = 1
        self.lengths[row] = self.prompt_lengths[row] = n
        self.hashes[row] = prompt_hash
        self.steps[row] = 0
        self.remaining[row] = min(self.common.max_seq_len - n, self.common.max_new_tokens)
        if self.decoder is not None:
            self.decoder.start(row, n, *text)

    def row_observation(self, row: int) -> dict[str, Any]:
        obs = {"input_ids": self.ids[row].copy(), "attention_mask": self.mask[row].copy(),
               "hash": self.hashes[row:row + 1].copy()}
        if self.decoder is not None:
            obs["text"] = self.decoder.texts[row][: self.common.max_text_chars]
        return obs

    def state(self, row: int, task: Task, done: bool) -> HashingState:
        n = int(self.lengths[row])
        ids = self.ids[row, :n].copy()
        ids.setflags(write=False)
        text = self.decoder.state(row) if self.decoder is not None else None
        return HashingState(ids, int(self.prompt_lengths[row]), int(self.hashes[row]), int(self.steps[row]),
                            bool(done), task, text, self.common.signature)

    def restore(self, row: int, state: HashingState) -> None:
        """Load ``state`` into ``row`` (validated first: a bad state changes nothing)."""
        if not isinstance(state, HashingState):
            raise TypeError(f"set_state expects a HashingState (from get_state), got {type(state).__name__}.")
        if state.signature != self.common.signature:
            raise ValueError(
                f"This state was taken from an env with (vocab_size, max_seq_len, text_output, hash_seed) = "
                f"{state.signature}, but this env has {self.common.signature}."
            )
        n = len(state.token_ids)
        self.ids[row] = 0
        self.ids[row, :n] = state.token_ids
        self.mask[row] = 0
        self.mask[row, :n] = 1
        self.lengths[row], self.prompt_lengths[row] = n, state.prompt_length
        self.hashes[row], self.steps[row] = np.uint64(state.hash), state.steps
        self.remaining[row] = min(self.common.max_seq_len - n, self.common.max_new_tokens - state.steps)
        if self.decoder is not None:
            self.decoder.restore(row, *state.text)

    # ---------------------------------------------------------------------------- batches
    def _hash_into(self, rows: np.ndarray | slice, tokens: np.ndarray) -> None:
        """``hashes[rows] = H(hashes[rows], tokens)`` with a per-token key table and in-place ops
        (same values as :func:`~gym_llm.envs.hashing.chain_hash.chain_step`, ~2x faster at B = 64)."""
        z = self.hashes[rows] ^ self.common.token_keys[tokens]  # h XOR (t + 1) * phi, (B,) uint64
        tmp = z >> _S30
        z ^= tmp
        z *= _M1
        np.right_shift(z, _S27, out=tmp)
        z ^= tmp
        z *= _M2
        np.right_shift(z, _S31, out=tmp)
        z ^= tmp
        self.hashes[rows] = z

    def append(self, rows: np.ndarray | slice, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append one token to each of ``rows`` (an index array, or ``slice(None)`` for all rows) and
        return their ``(terminated, truncated)``. ``tokens`` are validated ids, ``(len(rows),)``."""
        terminated = self.common.is_eos[tokens]
        flat_index = self._row_offsets[rows] + self.lengths[rows]  # position (row, length) in the flat buffers
        self._ids_flat[flat_index] = tokens
        self._mask_flat[flat_index] = 1
        self.lengths[rows] += 1
        self.steps[rows] += 1
        self.remaining[rows] -= 1  # tokens each row may still take
        truncated = self.remaining[rows] <= 0
        if self.common.has_eos:
            truncated &= ~terminated
        self._hash_into(rows, tokens)
        if self.decoder is not None:
            row_ids = self._all_rows[rows]
            self.decoder.advance(self.ids, self.lengths, row_ids)
            texts, limit = self.decoder.texts, self.common.max_text_chars
            over = np.fromiter((len(texts[i]) > limit for i in row_ids.tolist()), dtype=bool, count=len(row_ids))
            truncated |= over & ~terminated
        return terminated, truncated

    def batch_observation(self, copy: bool = True) -> dict[str, Any]:
        obs = {"input_ids": self.ids.copy() if copy else self.ids,
               "attention_mask": self.mask.copy() if copy else self.mask,
               "hash": self.hashes[:, None].copy() if copy else self.hashes[:, None]}
        if self.decoder is not None:
            limit = self.common.max_text_chars
            obs["text"] = tuple(t if len(t) <= limit else t[:limit] for t in self.decoder.texts)
        return obs

