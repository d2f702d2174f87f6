"""How the :class:`~gym_llm_adapters.collector.Collector` steps one shard (one vector env): generate for its
waiting sub-envs, turn the completions into actions, step the env (in a background thread with ``overlap``) and
absorb the results into step records and finished episodes. The module docstring of
:mod:`gym_llm_adapters.collector` has the rules (autoreset, groups, failures).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from gym_llm_adapters.collector_envs import obs_at, token_ids
from gym_llm_adapters.collector_tree import TreeState
from gym_llm_adapters.engines.validate import check_completions
from gym_llm_adapters.episodes import EpisodeBuilder, info_at
from gym_llm_adapters.types import Completion, StepRecord, Trajectory

logger = logging.getLogger("gym_llm_adapters.collector")  # its warnings are the collector's


@dataclass(eq=False)
class _Shard:
    """One vector env and the collector's view of its sub-envs."""

    env: VectorEnv
    offset: int  # global index of sub-env 0
    group_offset: int
    group_size: int
    mode: Literal["text", "tokens"]
    autoreset: AutoresetMode
    action_length: int
    vocab_size: int | None = None
    env_id: str = ""
    spec_id: str = ""  # the env's RecordedEnvSpec (gym_llm_adapters.env_spec), stamped on its records
    prompts: list[np.ndarray | None] = dataclasses.field(default_factory=list)
    texts: list[str] = dataclasses.field(default_factory=list)
    builders: list[EpisodeBuilder | None] = dataclasses.field(default_factory=list)
    pending_reset: np.ndarray | None = None
    idle: np.ndarray | None = None  # run_episodes: sub-envs whose one episode has ended
    tree: TreeState | None = None  # branch_turn: the tree groups' bookkeeping (collector_tree)
    future: Future | None = None
    inflight: dict[int, Completion] | None = None

    @property
    def num_envs(self) -> int:
        return int(self.env.num_envs)



class _ShardSteps:
    """The collector's stepping of a shard, as methods of :class:`~gym_llm_adapters.collector.Collector` (which
    holds the state they use: the engine, sampling, stats and the batch buffers)."""

    def _advance(self, shard: _Shard) -> None:
        """Absorb the shard's in-flight step (overlap), then generate and step it once."""
        if shard.future is not None:
            try:
                result, inflight = self._wait(shard)
                self._absorb(shard, inflight, result)
            except BaseException as e:
                self._failed(shard, e)
                return
            if self._batch_ready():
                return
        if shard.idle is not None and shard.idle.all():
            return
        completions = self._generate(shard)  # an engine error leaves every state untouched
        actions = self._actions(shard, completions)
        if shard.tree is not None:  # the state before this step, for a leader that ends its episode in it
            active = np.zeros(shard.num_envs, dtype=bool)
            active[list(completions)] = True
            shard.tree.before_step(shard, active)
        if self._executor is not None:
            shard.inflight = completions
            shard.future = self._executor.submit(self._timed_step, shard.env, actions)
            return
        try:
            result = self._timed_step(shard.env, actions)
            self._absorb(shard, completions, result)
        except BaseException as e:  # the envs moved on: what the collector holds may not match them any more
            self._failed(shard, e)

    def _wait(self, shard: _Shard) -> tuple[Any, dict[int, Completion]]:
        future, inflight = shard.future, shard.inflight
        shard.future = shard.inflight = None
        return future.result(), inflight

    def _timed_step(self, env: VectorEnv, actions: Any) -> tuple[Any, float]:
        start = time.perf_counter()
        result = env.step(actions)
        return result, time.perf_counter() - start

    def _generate(self, shard: _Shard) -> dict[int, Completion]:
        waiting = shard.pending_reset if shard.idle is None else shard.pending_reset | shard.idle
        if shard.tree is not None:
            waiting = waiting | shard.tree.paused
        active = np.flatnonzero(~waiting)
        if len(active) == 0:
            return {}
        sampling = self.sampling
        if sampling.seed is None and self.seed is not None:
            sampling = dataclasses.replace(sampling, seed=(self.seed + self._calls * self._seed_stride) % 2**62)
        elif sampling.seed is not None:
            sampling = dataclasses.replace(sampling, seed=(sampling.seed + self._calls * self._seed_stride) % 2**62)
        start = time.perf_counter()
        prompts = [shard.prompts[i] for i in active]
        completions = self.engine.generate(prompts, sampling)
        self.stats.generate_s += time.perf_counter() - start
        # checked before any env sees them: a bad completion costs the call, never a mislabelled step
        completions = check_completions(completions, prompts, engine=self.engine, sub_envs=(active + shard.offset).tolist(),
                                        vocab_size=shard.vocab_size)
        self._calls += 1
        return dict(zip(active.tolist(), completions))

    def _actions(self, shard: _Shard, completions: dict[int, Completion]) -> Any:
        N = shard.num_envs
        if shard.mode == "tokens":
            input_ids = np.zeros((N, shard.action_length), dtype=np.int64)  # (N, L) right-padded
            attention = np.zeros((N, shard.action_length), dtype=np.int8)
            for i, c in completions.items():
                input_ids[i, : len(c.token_ids)] = c.token_ids
                attention[i, : len(c.token_ids)] = 1
            return {"input_ids": input_ids, "attention_mask": attention}
        texts = [""] * N
        for i, c in completions.items():
            text = c.text
            if len(text) > shard.action_length:
                if not self._warned_clip:
                    logger.warning("A completion has %d characters, more than the env accepts (%d); clipping it.",
                                   len(text), shard.action_length)
                    self._warned_clip = True
                text = text[: shard.action_length]
            texts[i] = text
        return tuple(texts)

    def _absorb(self, shard: _Shard, completions: dict[int, Completion], result: tuple[Any, float]) -> None:
        (observations, rewards, terminated, truncated, infos), env_s = result
        self.stats.env_s += env_s
        self.stats.env_steps += 1
        tree = shard.tree
        paused = tree.paused.copy() if tree is not None else None  # as they were for this step (branches unpause)
        for i in range(shard.num_envs):
            if shard.idle is not None and shard.idle[i] or paused is not None and paused[i]:
                continue  # run_episodes' idle sub-envs; a tree's paused ones (the env left them as they were)
            obs_i, info_i = obs_at(observations, i), info_at(infos, i)
            if shard.pending_reset[i]:  # NEXT_STEP: this step started sub-env i's next episode
                shard.pending_reset[i] = False
                self._start_episode(shard, i, obs_i, info_i)
                continue
            done = bool(terminated[i] or truncated[i])
            same_step = done and shard.autoreset == AutoresetMode.SAME_STEP
            step_info = info_i.get("final_info", {}) if same_step else info_i
            final_obs = info_i.get("final_obs") if same_step else obs_i
            completion = completions[i]
            builder = shard.builders[i]
            record = builder.add_step(completion, reward=float(rewards[i]), terminated=bool(terminated[i]),
                                      truncated=bool(truncated[i]), info=step_info, prompt_text=shard.texts[i])
            self.stats.steps += 1
            self.stats.prompt_tokens += len(completion.prompt_ids)
            self.stats.generated_tokens += len(completion.token_ids)
            self._on_step(record)
            if not done:
                self._observe(shard, i, obs_i)
                if tree is not None:
                    tree.stepped(shard, i, False)
                continue
            if tree is not None:
                tree.stepped(shard, i, True)
            final_ids = token_ids(final_obs) if shard.mode == "tokens" and final_obs is not None else None
            trajectory = builder.finish(final_ids, step_info.get("policy_mask") if shard.mode == "tokens" else None)
            self.stats.episodes += 1
            if shard.idle is not None:  # run_episodes: one episode per sub-env
                self._finished[trajectory.env_index] = trajectory
                shard.idle[i], shard.builders[i] = True, None
                continue
            self._on_episode(trajectory)
            if same_step:
                self._start_episode(shard, i, obs_i, info_i)
            else:
                shard.builders[i] = None
                shard.pending_reset[i] = True
            if tree is not None:
                tree.ended_episode(shard, i)

    def _on_step(self, record: StepRecord) -> None:
        """Where a finished step goes (steps mode: the batch buffer)."""
        if self.mode == "steps":
            self._steps.append(record)

    def _on_episode(self, trajectory: Trajectory) -> None:
        """Where a finished episode goes (episodes mode: the group buffer, released by whole groups)."""
        if self.mode == "episodes":
            self._groups.add(trajectory)

    # ---------------------------------------------------------------------------- episodes
    def _start_episode(self, shard: _Shard, i: int, obs: Any, info: dict[str, Any]) -> None:
        group = int(info.get("group_id", i // shard.group_size))
        round_ = int(info.get("round", -1))
        shard.builders[i] = None
        self._observe(shard, i, obs)
        shard.builders[i] = EpisodeBuilder(shard.offset + i, int(info.get("task_id", -1)), shard.group_offset + group,
                                           round_, shard.prompts[i], shard.env_id, shard.spec_id)

    def _observe(self, shard: _Shard, i: int, obs: Any) -> None:
        if shard.mode == "tokens":
            ids = token_ids(obs)
            text = self.tokenizer.decode(ids.tolist(), skip_special_tokens=False) if (
                self.record_prompt_text and self.tokenizer is not None) else ""
        else:
            text = str(obs)
            ids = np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)
        shard.prompts[i], shard.texts[i] = ids, text
        if shard.builders[i] is not None:
            shard.builders[i].observe(ids)
