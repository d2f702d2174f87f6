"""Evaluation: run a fixed set of episodes with an engine and summarise rewards, pass rate and throughput.

An evaluation runs one episode per task on a fixed list of tasks — by default the first ``episodes`` tasks
of the source (cycling when the source is smaller), or any ``task_ids`` — in chunks of ``num_envs`` sub-envs
(:meth:`Collector.run_episodes` with per-sub-env ``task_ids``). Every call evaluates the same tasks with the
same seeds, so the evaluations of one run are comparable.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import gymnasium as gym
import numpy as np

from gym_llm_adapters.collector import Collector
from gym_llm_adapters.engines.base import Engine, SamplingConfig
from gym_llm_adapters.rollout_io import RolloutWriter
from gym_llm_adapters.types import Trajectory

__all__ = ["EvalSummary", "Evaluator", "summarize"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalSummary:
    """Aggregates of one evaluation.

    Attributes:
        episodes: how many episodes ran.
        reward_mean / reward_std: over episodes (an episode's reward is the sum of its step rewards).
        pass_rate: fraction of episodes with ``reward >= pass_threshold``.
        policy_tokens_mean: sampled tokens per episode.
        truncated_rate: fraction of episodes that were truncated (hit a length or turn limit).
        tokens_per_s / episodes_per_s: generation throughput over ``wall_s``.
        wall_s: seconds the evaluation took.
        reward_failed: episodes whose reward could not be computed (``Trajectory.reward_failed``: a judge's or a
            grader's failure); they count as not passing, and the summary says how many.
    """

    episodes: int
    reward_mean: float
    reward_std: float
    pass_rate: float
    policy_tokens_mean: float
    truncated_rate: float
    tokens_per_s: float
    episodes_per_s: float
    wall_s: float
    reward_failed: int = 0

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        return {prefix + k: float(v) for k, v in self.__dict__.items()}

    def __str__(self) -> str:
        return (f"{self.episodes} episodes: mean reward {self.reward_mean:.3f} (std {self.reward_std:.3f}), "
                f"pass rate {self.pass_rate:.1%}, {self.policy_tokens_mean:.1f} tokens/episode, "
                f"{self.tokens_per_s:.1f} tokens/s, {self.wall_s:.1f} s"
                + (f"; {self.reward_failed} not scored (counted as not passing)" if self.reward_failed else ""))


def summarize(trajectories: Sequence[Trajectory], *, pass_threshold: float, wall_s: float) -> EvalSummary:
    """An :class:`EvalSummary` of finished episodes."""
    if not trajectories:
        raise ValueError("nothing to summarise: no episodes.")
    rewards = np.array([t.reward for t in trajectories], dtype=np.float64)
    tokens = np.array([t.num_policy_tokens for t in trajectories], dtype=np.float64)
    wall = max(wall_s, 1e-9)
    return EvalSummary(
        episodes=len(trajectories), reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
        pass_rate=float((rewards >= pass_threshold).mean()), policy_tokens_mean=float(tokens.mean()),
        truncated_rate=float(np.mean([t.truncated for t in trajectories])),
        tokens_per_s=float(tokens.sum() / wall), episodes_per_s=len(trajectories) / wall, wall_s=float(wall_s),
        reward_failed=sum(t.reward_failed for t in trajectories))


MAX_EVAL_BATCH = 256


def default_num_envs(episodes: int, cap: int = MAX_EVAL_BATCH) -> int:
    """Sub-envs for ``episodes`` evaluation episodes: the fewest batches of at most ``cap``, balanced.

    >>> [default_num_envs(n) for n in (1, 64, 200, 256, 257, 300, 1000)]
    [1, 64, 200, 256, 129, 150, 250]
    """
    batches = -(-episodes // cap)
    return -(-episodes // batches)


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="eval", unit="ep", dynamic_ncols=True)


class Evaluator:
    """Runs ``episodes`` episodes of ``env_id`` with ``engine``; the same tasks on every call.

    Args:
        env_id / env_kwargs: the env and its task source (tokens mode and the engine's tokenizer are set here).
        engine: generates the replies; its current weights are evaluated.
        episodes: episodes per evaluation.
        sampling: per-turn sampling (greedy by default: ``temperature=0``).
        seed: the env seed: fixes which tasks are evaluated.
        max_seq_len / max_new_tokens: the env's token limits.
        num_envs: sub-envs stepped as one batch (default: the episodes in the fewest batches of at most 256,
            balanced: 200 episodes run as one batch of 200, 300 as two of 150 — every sub-env runs a real task
            and the engine batches as many requests as it can).
        task_ids: the tasks to evaluate, one episode each: ``episodes`` indices into the env's task source,
            ``"first"`` (default; the first ``episodes`` tasks) or ``"shuffle"`` (a sample seeded by ``seed``).
            Either way the list cycles when the source holds fewer tasks.
        progress: show a progress bar.
    """

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any], engine: Engine, *, episodes: int,
                 sampling: SamplingConfig, seed: int = 0, max_seq_len: int = 2048, max_new_tokens: int = 256,
                 num_envs: int | None = None, task_ids: Sequence[int] | Literal["first", "shuffle"] = "first",
                 progress: bool = False):
        if episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {episodes}.")
        self.episodes = int(episodes)
        self.seed = int(seed)
        self.num_envs = int(num_envs or default_num_envs(self.episodes))
        self.envs = gym.make_vec(env_id, num_envs=self.num_envs, group_size=1, vectorization_mode="vector_entry_point",
                                 mode="tokens", tokenizer=engine.tokenizer, max_seq_len=max_seq_len,
                                 max_action_tokens=max_new_tokens, **dict(env_kwargs))
        num_tasks = len(self.envs.unwrapped.parts.tasks)
        if task_ids in ("first", "shuffle"):
            order = np.random.default_rng(self.seed).permutation(num_tasks) if task_ids == "shuffle" else None
            task_ids = [i % num_tasks if order is None else order[i % num_tasks] for i in range(self.episodes)]
        task_ids = [int(t) for t in task_ids]
        if len(task_ids) != self.episodes or not all(0 <= t < num_tasks for t in task_ids):
            raise ValueError(f"task_ids must be {self.episodes} indices in [0, {num_tasks}), got {task_ids[:8]}...")
        self.task_ids = task_ids
        self.collector = Collector(self.envs, engine, sampling, episodes_per_batch=1, seed=self.seed)
        self.progress = progress

    def run(self, *, pass_threshold: float = 1.0, writer: RolloutWriter | None = None
            ) -> tuple[list[Trajectory], EvalSummary]:
        """Evaluate once; returns the episodes (in task-list order) and their summary."""
        start = time.perf_counter()
        trajectories: list[Trajectory] = []
        bar = _progress_bar(self.episodes, self.progress)
        for chunk_start in range(0, self.episodes, self.num_envs):
            chunk = self.task_ids[chunk_start:chunk_start + self.num_envs]
            chunk = chunk + [None] * (self.num_envs - len(chunk))  # spare sub-envs run throwaway tasks
            done = self.collector.run_episodes(seed=self.seed + chunk_start, options={"task_ids": chunk})
            kept = [t for t, task in zip(done, chunk) if task is not None]
            trajectories += kept
            if bar is not None:
                bar.update(len(kept))
        if bar is not None:
            bar.close()
        wall_s = time.perf_counter() - start
        if writer is not None:
            writer.write(trajectories)
        summary = summarize(trajectories, pass_threshold=pass_threshold, wall_s=wall_s)
        logger.info("eval: %s", summary)
        return trajectories, summary

    def close(self) -> None:
        self.collector.close()
        self.envs.close()
