"""Search over turns at inference time, on a native vector env: best-of-k per turn (a tree) against k independent
episodes (flat sampling), with the generation budget each one spends counted.

Both take an env made with ``group_size=k``: each group of ``k`` sub-envs plays one problem (one task).

* :func:`best_of_k_per_turn` — at every turn each member of a live group samples one reply; the env scores them
  (its per-turn reward); the best one (``select``, default: the highest reward, the first on ties) is kept and the
  other ``k - 1`` members continue forks of its episode
  (:meth:`~gym_llm.core.branching.BranchingMixin.branch`: conversation, token buffers, a Python REPL's state).
  The group follows one path of the tree; it ends when the kept reply ends the episode. Budget: ``k`` replies per
  turn per problem.
* :func:`independent_episodes` — the ``k`` members play ``k`` whole episodes, none sees another; the problem's
  result is its best episode (the highest return, the first on ties). Budget: ``k`` replies per turn per problem
  while the episodes last.

So the two spend the same number of replies on an episode of fixed length, and see the same rewards; what differs is
where the samples go. A per-turn reward that says whether the turn was right (a process reward: a checked
intermediate answer, a tool call that ran) lets the tree repair a wrong turn before the next one builds on it, where
flat sampling needs one episode right at every turn. With per-turn success ``p`` over ``T`` turns, flat solves
``1 - (1 - p^T)^k`` of the problems and the tree ``(1 - (1 - p)^k)^T`` when turns are independent
(``examples/tree_search.py`` measures both on a real model; docs/branching.md).

Finished groups are paused (:meth:`~gym_llm.core.branching.BranchingMixin.pause`): nothing is generated for them.
The env is left unpaused afterwards; reset it before using it again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from gym_llm_adapters.collector_envs import action_length, env_mode, obs_at, token_ids, vocab_size
from gym_llm_adapters.engines.base import SamplingConfig
from gym_llm_adapters.engines.validate import check_completions
from gym_llm_adapters.episodes import info_at

__all__ = ["SearchOutcome", "best_of_k_per_turn", "independent_episodes", "highest_reward"]

SEED_STRIDE = 1_000_003
"""Sampling seeds of successive engine calls differ by this (so no two turns reuse one random stream)."""


@dataclass(frozen=True, kw_only=True)
class SearchOutcome:
    """One problem's result.

    Attributes:
        task_id: the problem (the env's task id).
        group: its group of sub-envs.
        rewards: the reward of each turn of the path kept (the tree's path; flat: the best episode).
        replies: the text of each reply on that path.
        generations: replies sampled for this problem (all members, all turns).
        generated_tokens: tokens in those replies.
    """

    task_id: int
    group: int
    rewards: tuple[float, ...]
    replies: tuple[str, ...]
    generations: int
    generated_tokens: int

    @property
    def episode_return(self) -> float:
        """The sum of :attr:`rewards`."""
        return float(sum(self.rewards))


def highest_reward(rewards: np.ndarray) -> int:
    """The default ``select``: the index of the highest reward, the first on ties. ``rewards``: ``(k,)``."""
    return int(np.argmax(rewards))


class _Driver:
    """Resets the env, samples one reply per live sub-env, steps, and counts the budget."""

    def __init__(self, envs: Any, engine: Any, sampling: SamplingConfig, seed: int | None):
        base = envs.unwrapped
        if not getattr(base, "PAUSABLE", False) or not hasattr(base, "branch"):
            raise ValueError(f"search needs one of gym_llm's native vector envs, which can pause and branch sub-envs "
                             f"(gym.make_vec(id, vectorization_mode='vector_entry_point', group_size=k)); got "
                             f"{type(base).__name__}.")
        if not isinstance(sampling, SamplingConfig) or sampling.n != 1:
            raise ValueError("sampling must be a SamplingConfig with n=1: the k samples of a turn are the group's k "
                             "sub-envs (make the env with group_size=k).")
        self.k = int(getattr(base, "group_size", 1))
        if self.k < 2:
            raise ValueError(f"search needs groups of k >= 2 sub-envs (group_size=k), got group_size={self.k}.")
        self.envs, self.base, self.engine, self.sampling, self.seed = envs, base, engine, sampling, seed
        self.mode = env_mode(base)
        self.action_length, self.vocab_size = action_length(base, self.mode), vocab_size(base, self.mode)
        if self.mode == "tokens" and sampling.max_tokens > self.action_length:
            raise ValueError(f"sampling.max_tokens={sampling.max_tokens} is more than the env accepts per action "
                             f"(max_action_tokens={self.action_length}); lower max_tokens or make the env with "
                             f"max_action_tokens >= {sampling.max_tokens}.")
        self.N = base.num_envs
        self.tokenizer = getattr(engine, "tokenizer", None)
        if self.mode == "text" and self.tokenizer is None:
            raise ValueError(f"a text-mode env needs an engine with a .tokenizer (to send prompts as ids); "
                             f"{type(engine).__name__} has none. Make the env with mode='tokens'.")
        self.calls = 0
        self.generations = np.zeros(self.N // self.k, dtype=np.int64)  # (groups,)
        self.tokens = np.zeros(self.N // self.k, dtype=np.int64)  # (groups,)
        self.prompts: list[Any] = [None] * self.N
        obs, infos = envs.reset(seed=seed)
        self.task_ids = [int(info_at(infos, g * self.k)["task_id"]) for g in range(self.N // self.k)]
        self.observe(obs, range(self.N))

    def observe(self, observations: Any, indices: Sequence[int]) -> None:
        for i in indices:
            obs = obs_at(observations, i)  # prompts go to the engine as ids, as the collector sends them
            self.prompts[i] = token_ids(obs) if self.mode == "tokens" else np.asarray(
                self.tokenizer.encode(str(obs), add_special_tokens=False), dtype=np.int64)

    def step(self, live: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """One turn for the ``live`` sub-envs (``(N,)`` bool; the others are paused). Returns the ``(N,)`` rewards,
        the ``(N,)`` ended flags and the ``N`` reply texts ("" where not live)."""
        self.base.unpause(np.flatnonzero(live).tolist())
        self.base.pause(np.flatnonzero(~live).tolist())
        active = np.flatnonzero(live)
        sampling = self.sampling
        base_seed = sampling.seed if sampling.seed is not None else self.seed
        if base_seed is not None:
            sampling = dataclasses.replace(sampling, seed=(base_seed + self.calls * SEED_STRIDE) % 2**62)
        self.calls += 1
        prompts = [self.prompts[i] for i in active]
        completions = check_completions(self.engine.generate(prompts, sampling), prompts, engine=self.engine,
                                        sub_envs=active.tolist(), vocab_size=self.vocab_size)
        texts = [""] * self.N
        if self.mode == "tokens":
            ids = np.zeros((self.N, self.action_length), dtype=np.int64)  # (N, L) right-padded
            mask = np.zeros((self.N, self.action_length), dtype=np.int8)
            for i, c in zip(active, completions):  # len(c.token_ids) <= max_tokens <= action_length (checked above)
                ids[i, :len(c.token_ids)], mask[i, :len(c.token_ids)] = c.token_ids, 1
            actions: Any = {"input_ids": ids, "attention_mask": mask}
        else:
            actions = [""] * self.N
        for i, c in zip(active, completions):
            texts[i] = c.text
            if self.mode == "text":
                actions[i] = c.text[: self.action_length]
            self.generations[i // self.k] += 1
            self.tokens[i // self.k] += len(c.token_ids)
        observations, rewards, terminated, truncated, _ = self.envs.step(
            actions if self.mode == "tokens" else tuple(actions))
        self.observe(observations, active)
        ended = np.asarray(terminated) | np.asarray(truncated)  # (N,)
        return np.asarray(rewards, dtype=np.float64), ended, texts

    def outcome(self, g: int, rewards: list[float], replies: list[str]) -> SearchOutcome:
        return SearchOutcome(task_id=self.task_ids[g], group=g, rewards=tuple(rewards), replies=tuple(replies),
                             generations=int(self.generations[g]), generated_tokens=int(self.tokens[g]))

    def finish(self) -> None:
        self.base.unpause(range(self.N))


def best_of_k_per_turn(envs: Any, engine: Any, sampling: SamplingConfig, *, seed: int | None = None,
                       select: Callable[[np.ndarray], int] = highest_reward) -> list[SearchOutcome]:
    """Best-of-k per turn (module docstring): one :class:`SearchOutcome` per group, in group order.

    Args:
        envs: a native vector env made with ``group_size=k`` (``k >= 2``), text or tokens mode.
        engine: an engine (:mod:`gym_llm_adapters.engines`); ``sampling.n`` must be 1.
        seed: resets the env (which tasks the groups get) and seeds sampling unless ``sampling.seed`` is set.
        select: ``select(rewards) -> j`` picks the member to keep from the turn's ``(k,)`` rewards.
    """
    run = _Driver(envs, engine, sampling, seed)
    k, groups = run.k, run.N // run.k
    paths: list[tuple[list[float], list[str]]] = [([], []) for _ in range(groups)]
    live = np.ones(run.N, dtype=bool)
    try:
        while live.any():
            rewards, ended, texts = run.step(live)
            for g in np.flatnonzero(live[::k]):
                members = np.arange(g * k, (g + 1) * k)
                best = members[int(select(rewards[members].copy()))]
                paths[g][0].append(float(rewards[best]))
                paths[g][1].append(texts[best])
                if ended[best]:
                    live[members] = False
                else:  # the others continue the kept reply's episode (an ended one included: branch restarts it)
                    run.base.branch(int(best), [int(m) for m in members if m != best])
                    run.prompts[g * k:(g + 1) * k] = [run.prompts[best]] * k
    finally:
        run.finish()
    return [run.outcome(g, *paths[g]) for g in range(groups)]


def independent_episodes(envs: Any, engine: Any, sampling: SamplingConfig, *,
                         seed: int | None = None) -> list[SearchOutcome]:
    """Flat sampling (module docstring): each group's ``k`` members play one episode each; a problem's outcome is
    its best episode by return (the first on ties), its budget all ``k`` episodes'. Arguments as
    :func:`best_of_k_per_turn`."""
    run = _Driver(envs, engine, sampling, seed)
    k, groups = run.k, run.N // run.k
    paths: list[tuple[list[float], list[str]]] = [([], []) for _ in range(run.N)]
    live = np.ones(run.N, dtype=bool)
    try:
        while live.any():
            rewards, ended, texts = run.step(live)
            for i in np.flatnonzero(live):
                paths[i][0].append(float(rewards[i]))
                paths[i][1].append(texts[i])
            live &= ~ended
    finally:
        run.finish()
    outcomes = []
    for g in range(groups):
        returns = [sum(paths[g * k + j][0]) for j in range(k)]
        best = g * k + int(np.argmax(returns))
        outcomes.append(run.outcome(g, *paths[best]))
    return outcomes
