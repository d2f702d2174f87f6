"""``LLMHashing-v0``: one token per step, with a 64-bit chain hash naming every node of the token tree."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode

from gym_llm.rewards.deadline import DeadlineExceeded
from gym_llm.core.env import LLMEnv
from gym_llm.core.episode import EnvParts, Episode, ForkError, Transition
from gym_llm.core.tasks import Task, TaskOrder
from gym_llm.core.vector import LLMVectorEnv
from gym_llm.envs.hashing.state import HashingConfig, HashingCommon, HashingState, TokenChains
from gym_llm.envs.tokens import _DEFAULT_PROMPTS, _tokens_tasks

__all__ = ["HashingEpisode", "HashingState", "LLMHashingEnv", "LLMHashingVectorEnv", "build_hashing"]


def check_token_id(action: Any, vocab_size: int) -> int:
    """``action`` as a token id in ``[0, vocab_size)``, else ``TypeError``/``ValueError``."""
    if isinstance(action, np.ndarray) and action.shape == () and action.dtype.kind in "iu":
        action = action.item()
    if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
        raise TypeError(
            f"LLMHashing takes one token id per step: an int in [0, {vocab_size}), got {type(action).__name__}."
        )
    if not 0 <= int(action) < vocab_size:
        raise ValueError(f"Token id {int(action)} is outside the vocabulary [0, {vocab_size}).")
    return int(action)


class HashingEpisode(Episode):
    """One row of a :class:`TokenChains` (its own 1-row chains in a scalar env, a shared row in a vector env)."""

    def __init__(self, common: HashingCommon, chains: TokenChains | None = None, row: int = 0):
        self.common = common
        self.chains = chains if chains is not None else TokenChains(common, 1)
        self.row = row
        self.task: Task | None = None
        self._row_index = np.array([row])

    def start(self, task: Task) -> tuple[Any, dict[str, Any]]:
        self.chains.start(self.row, task)
        self.task = task
        return self.chains.row_observation(self.row), {"steps": 0}

    def check_action(self, action: Any) -> int:
        return check_token_id(action, self.common.vocab_size)

    def terminal_reward(self) -> float:
        if self.common.reward_fn is None:
            return 0.0
        n = int(self.chains.lengths[self.row])
        ids = self.chains.ids[self.row, :n].copy()
        return float(self.common.reward_fn(self.task, ids, int(self.chains.prompt_lengths[self.row])))

    def advance(self, action: int, response: Any) -> Transition:
        terminated, truncated = self.chains.append(self._row_index, np.array([action], dtype=np.int64))
        done = bool(terminated[0] or truncated[0])
        info = {"steps": int(self.chains.steps[self.row])}
        try:
            reward = self.terminal_reward() if done else 0.0
        except DeadlineExceeded as e:  # a with_deadline hook past its limit: fail closed, and say so
            reward, info["reward_error"] = 0.0, f"DeadlineExceeded: {e}"
        return Transition(self.chains.row_observation(self.row), reward, bool(terminated[0]), bool(truncated[0]), info)

    def state(self, done: bool) -> HashingState:
        if self.task is None:
            raise ResetNeeded("get_state() needs an episode: call reset() first.")
        return self.chains.state(self.row, self.task, done)

    def restore(self, state: HashingState) -> None:
        self.chains.restore(self.row, state)
        self.task = state.task

    def fork(self) -> "HashingEpisode":
        """An independent sibling in a 1-row chain of its own, with this one's tokens, hash, step count and text
        (see :meth:`Episode.fork`)."""
        if self.task is None:
            raise ForkError("fork() needs an episode: call reset() first.")
        sibling = HashingEpisode(self.common)
        sibling.restore(self.state(False))
        return sibling

    def render(self) -> str:
        n = int(self.chains.lengths[self.row])
        if self.chains.decoder is not None:
            return self.chains.decoder.texts[self.row]
        if self.common.tokenizer is not None:
            return self.common.tokenizer.decode(self.chains.ids[self.row, :n], skip_special_tokens=False)
        return " ".join(map(str, self.chains.ids[self.row, :n].tolist()))


def build_hashing(*, prompts: Any = None, split: str | None = None, task_order: TaskOrder = "shuffle",
                  **kwargs: Any) -> EnvParts:
    common = HashingCommon(HashingConfig(**kwargs))
    if prompts is None:
        if common.tokenizer is None:
            raise ValueError("Without a tokenizer, pass prompts= as token-id lists, e.g. prompts=[[1, 2, 3]].")
        prompts = list(_DEFAULT_PROMPTS)
    tasks = _tokens_tasks(prompts, split)
    for task in tasks:
        common.prompt(task)  # encode and validate every prompt now, not mid-rollout
    return EnvParts(tasks=tasks, new_episode=lambda: HashingEpisode(common), observation_space=common.observation_space,
                    action_space=common.action_space, task_order=task_order, extra={"hashing": common})


class LLMHashingEnv(LLMEnv):
    """Token-level generation for tree search: one token per step, each node named by a 64-bit hash.

    ## Description
    The state is a token chain (prompt + generated tokens). Each step appends one token. The
    observation carries the chain (padded ids + mask) and its hash ``h``, computed incrementally as
    ``h_{t+1} = H(h_t, token)`` from the prompt's hash (:mod:`gym_llm.envs.hashing.chain_hash` documents
    ``H``): the same chain has the same hash whatever the padding, batch position or prompt split, and
    the children of one node never collide — so hashes serve directly as node ids (transposition
    tables, MCTS trees, deduplication). :meth:`get_state` / :meth:`set_state` snapshot and restore an
    episode, so a search can branch from any node.

    ## Action Space
    ``Discrete(V)``: the next token id.

    ## Observation Space
    ``Dict(input_ids=MultiDiscrete([V] * L), attention_mask=MultiBinary(L), hash=Box(0, 2**64 - 1, (1,), uint64))``
    (the hash as a 1-element array, ``int(obs["hash"][0])``; ``(N, 1)`` in the vector env),
    right-padded (never infer padding from ids: the mask marks real tokens); with ``text_output=True``
    also ``text=UnicodeText(max_text_chars)``, decoded incrementally (a window of the newest tokens per
    step, see :mod:`gym_llm.envs.detok`).

    ## Rewards
    | event | reward |
    |---|---|
    | a step that ends the episode | ``reward_fn(task, token_ids, prompt_length)`` (default 0.0) |
    | any other step | 0.0 |

    ## Starting State
    The next prompt of the task stream (text prompts are encoded with the tokenizer).

    ## Episode End
    Terminated when the token is an eos id (``eos_token_ids``, default the tokenizer's). Truncated when
    the chain reaches ``max_seq_len`` tokens, after ``max_new_tokens`` steps, or when the text outgrows
    ``max_text_chars`` (all enforced by the env).

    ## Arguments
    ``prompts`` (str / token-id lists / records, a .jsonl path or a ``datasets.Dataset``; default: four
    story openings, which need a tokenizer), ``split``, ``task_order``, and the
    :class:`~gym_llm.envs.hashing.state.HashingConfig` fields: ``tokenizer``, ``vocab_size``,
    ``max_seq_len``, ``max_new_tokens``, ``eos_token_ids``, ``text_output``, ``max_text_chars``,
    ``apply_chat_template``, ``hash_seed``, ``reward_fn``.

    ## Vectorized environment
    :class:`LLMHashingVectorEnv` steps all sub-envs with numpy batch operations (append, hash, end
    checks); ``gym.make_vec("LLMHashing-v0", num_envs=64, tokenizer=tok)``.

    ## Version History
    * v0: initial version.
    """

    def __init__(self, *, render_mode: str | None = None, **kwargs: Any):
        super().__init__(build_hashing(**kwargs), render_mode=render_mode)

    def get_state(self) -> HashingState:
        """A snapshot of the current episode (cheap: one copy of the chain's ids)."""
        return self._episode.state(self._needs_reset)

    def set_state(self, state: HashingState) -> None:
        """Continue from ``state`` (from :meth:`get_state` of an env with the same settings). A state
        taken at the end of an episode leaves the env needing ``reset``. Bad input changes nothing."""
        if self._round < 0:
            raise ResetNeeded("set_state() needs a started env: call reset() once first.")
        self._episode.restore(state)
        self._needs_reset = state.done


class LLMHashingVectorEnv(LLMVectorEnv):
    """Native vector env of :class:`LLMHashingEnv`: all sub-envs live in one :class:`TokenChains`, so a
    step is a few numpy operations over the batch; only rows whose episode ends run Python code.

    Same data as :class:`gymnasium.vector.SyncVectorEnv` over scalar envs for the same seeds (plus
    ``group_id``); autoreset ``SAME_STEP`` by default (``NEXT_STEP``/``DISABLED`` supported), the
    terminal observation/info in ``info["final_obs"]``/``info["final_info"]``.

    Args:
        num_envs, group_size, autoreset_mode, render_mode: see :class:`~gym_llm.core.vector.LLMVectorEnv`.
        copy: return copies of the state arrays (default, like Gymnasium's vector envs). ``False``
            returns views that the next step overwrites — faster, for callers that consume each
            observation before stepping again.
        num_workers: accepted for symmetry with the other vector envs and ignored (a step is numpy work).
        **kwargs: as :class:`LLMHashingEnv`.
    """

    def __init__(self, num_envs: int = 1, *, group_size: int = 1, autoreset_mode: Any = "SameStep",
                 task_assignment: str = "per_group",
                 render_mode: str | None = None, copy: bool = True, num_workers: int | None = None, **kwargs: Any):
        parts = build_hashing(**kwargs)
        super().__init__(parts, num_envs, group_size=group_size, autoreset_mode=autoreset_mode,
                         task_assignment=task_assignment, num_workers=0,
                         render_mode=render_mode)
        hashing: HashingCommon = parts.extra["hashing"]
        self.chains = TokenChains(hashing, self.num_envs)
        self.episodes = [HashingEpisode(hashing, self.chains, i) for i in range(self.num_envs)]
        self.copy = bool(copy)
        self._vocab_size = hashing.vocab_size
        self._task_ids = np.zeros(self.num_envs, dtype=np.int64)
        self._static_info: dict[str, np.ndarray] | None = None

    # ------------------------------------------------------------------------------- hooks
    def _start(self, i: int, forced) -> tuple[Any, dict[str, Any]]:
        observation, info = super()._start(i, forced)
        self._task_ids[i] = info["task_id"]
        self._static_info = None
        return observation, info

    def _batch(self, observations: list[Any]) -> dict[str, Any]:
        return self.chains.batch_observation(self.copy)  # the rows hold every sub-env's current observation

    # -------------------------------------------------------------------------------- step
    def _check_actions(self, actions: Any, live: np.ndarray) -> np.ndarray:
        if isinstance(actions, (list, tuple)) and len(actions) == self.num_envs:
            for i, action in enumerate(actions):  # per sub-env first, so the error says which one
                if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
                    self._refuse(i, action)
        try:
            tokens = np.asarray(actions)
        except Exception as e:  # ragged lists and other odd objects
            raise TypeError(f"Vector step() expects {self.num_envs} token ids, got {type(actions).__name__}: {e}") from e
        if tokens.shape != (self.num_envs,):
            raise ValueError(
                f"Vector step() expects {self.num_envs} token ids (shape ({self.num_envs},)), got shape {tokens.shape}."
            )
        if tokens.dtype.kind not in "iu":
            raise TypeError(f"Token ids must be integers, got dtype {tokens.dtype}.")
        checked = tokens if live.all() else tokens[live]
        if tokens.dtype == np.int64:  # one reduction for both bounds: negative ids view as huge uint64
            out_of_range = checked.size and checked.view(np.uint64).max() >= self._vocab_size
        else:
            out_of_range = checked.size and (checked.min() < 0 or checked.max() >= self._vocab_size)
        if out_of_range:
            bad = int(np.flatnonzero(live & ((tokens < 0) | (tokens >= self._vocab_size)))[0])
            self._refuse(bad, int(tokens[bad]))
        return tokens.astype(np.int64, copy=False)

    def _refuse(self, i: int, action: Any) -> None:
        """Raise the scalar env's own error for ``action`` (:func:`check_token_id`), naming sub-env ``i``."""
        try:
            check_token_id(action, self._vocab_size)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{self.where(i)}: {e}") from None
        raise AssertionError("unreachable: the action was refused by the vector check")

    def _infos(self) -> dict[str, Any]:
        """Every sub-env's step info as Gymnasium's dict of arrays. Arrays that change only at resets
        (``task_id``, ``group_id``, ``round``, the all-True masks) are shared read-only between steps."""
        if self._static_info is None:
            static = {"_steps": np.ones(self.num_envs, dtype=bool), "task_id": self._task_ids.copy(),
                      "group_id": np.array(self._group_ids, dtype=np.int64),
                      "round": np.array(self._rounds, dtype=np.int64)}
            static.update({f"_{key}": static["_steps"] for key in ("task_id", "group_id", "round")})
            for value in static.values():
                value.setflags(write=False)
            self._static_info = static
        return {"steps": self.chains.steps.copy(), **self._static_info}

    def _writable(self, infos: dict[str, Any]) -> dict[str, Any]:
        """``infos`` with private copies of the shared arrays (before rows are changed in place)."""
        return {key: value.copy() if isinstance(value, np.ndarray) else value for key, value in infos.items()}

    def _set_info_row(self, infos: dict[str, Any], i: int, info: dict[str, Any]) -> None:
        for key, value in info.items():
            infos[key][i] = value

    def step(self, actions: Any):
        if not self._started:
            raise ResetNeeded("step() was called before reset(); call envs.reset(seed=...) first.")
        live = ~self._done
        if self.autoreset_mode == AutoresetMode.DISABLED and not live.all():
            raise ResetNeeded(
                f"Sub-envs {np.flatnonzero(~live).tolist()} have ended and autoreset is disabled; "
                "reset them with envs.reset(options={'reset_mask': mask})."
            )
        tokens = self._check_actions(actions, live)  # raises before anything changes
        all_live = bool(live.all())
        rows = slice(None) if all_live else np.flatnonzero(live)
        N = self.num_envs
        rewards = np.zeros(N, dtype=np.float64)
        if all_live:
            terminated, truncated = self.chains.append(rows, tokens)
        else:
            terminated, truncated = np.zeros(N, dtype=bool), np.zeros(N, dtype=bool)
            terminated[rows], truncated[rows] = self.chains.append(rows, tokens[rows])
        infos = self._infos()
        ended = np.flatnonzero(terminated | truncated).tolist() if terminated.any() or truncated.any() else []
        if ended or not all_live:
            infos = self._writable(infos)
        if not all_live:  # NEXT_STEP: the sub-envs that ended last step start their next episode now
            for i in np.flatnonzero(~live).tolist():
                _, info = self._start(i, None)
                self._done[i] = False
                self._set_info_row(infos, i, info)
        for i in ended:
            reward_error = None
            try:
                rewards[i] = self.episodes[i].terminal_reward()
            except DeadlineExceeded as e:  # a with_deadline hook past its limit: fail closed, and say so
                reward_error = f"DeadlineExceeded: {e}"
            if reward_error is not None and self.autoreset_mode != AutoresetMode.SAME_STEP:
                infos = self._add_info(infos, {"reward_error": reward_error}, i)
            if self.autoreset_mode == AutoresetMode.SAME_STEP:
                final_info = {key: infos[key][i].item() for key in ("steps", "task_id", "group_id", "round")}
                if reward_error is not None:
                    final_info["reward_error"] = reward_error
                infos = self._add_info(infos, {"final_obs": self.chains.row_observation(i), "final_info": final_info}, i)
                _, info = self._start(i, None)
                self._set_info_row(infos, i, info)
            else:
                self._done[i] = True
        return self.chains.batch_observation(self.copy), rewards, terminated, truncated, infos

    # ------------------------------------------------------------------------ tree search
    PAUSABLE = False  # the batched step below always appends a token to every live row

    def _copy_episode(self, source: HashingEpisode, dst: list[int]) -> None:  # branch(): rows of the shared chains
        state = source.state(False)
        for t in dst:
            self.episodes[t].restore(state)
            self._task_ids[t] = state.task.task_id
        self._static_info = None

    def _index(self, index: Any) -> int:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < self.num_envs:
            raise ValueError(f"index must be a sub-env index in [0, {self.num_envs}), got {index!r}.")
        if not self._started:
            raise ResetNeeded("get_state()/set_state() need a started env: call envs.reset() once first.")
        return int(index)

    def get_state(self, index: int) -> HashingState:
        """A snapshot of sub-env ``index``'s episode."""
        i = self._index(index)
        return self.episodes[i].state(bool(self._done[i]))

    def set_state(self, index: int, state: HashingState) -> None:
        """Continue sub-env ``index`` from ``state`` (bad input changes nothing)."""
        i = self._index(index)
        self.episodes[i].restore(state)
        self._task_ids[i] = state.task.task_id
        self._static_info = None
        self._done[i] = state.done


LLMHashingEnv.Vector = LLMHashingVectorEnv  # its native vector env (a fork of a sub-env is an LLMHashingEnv)
