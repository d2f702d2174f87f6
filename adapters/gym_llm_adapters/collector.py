"""The rollout collector: drives gym_llm vector envs with an engine and yields batches of episodes or steps.

Each vector-env step: the current observations become prompts (tokens mode: the observation's ids as
they are; text mode: the text encoded with the engine's tokenizer, no added special tokens), the engine
samples one completion per sub-env, the completions become the actions (ids, or text), and the env's
results become :class:`~gym_llm_adapters.types.StepRecord` s. Finished episodes become token-exact
:class:`~gym_llm_adapters.types.Trajectory` s (see :mod:`gym_llm_adapters.episodes`).

* **Autoreset.** ``SAME_STEP`` (gym_llm's default): a finished sub-env's terminal observation and info
  come from ``info["final_obs"]``/``info["final_info"]`` and the returned observation already starts the
  next episode. ``NEXT_STEP`` (Gymnasium's ``SyncVectorEnv`` default): the terminal step is returned as
  is and the next step resets; the collector generates nothing for that sub-env in that step.
  ``DISABLED`` is refused. The terminal reward and info are never lost.
* **Groups.** In episodes mode a batch is made of whole GRPO groups: the ``G`` trajectories of a group's
  round come out together, whatever order they finished in. ``episodes_per_batch`` must be a multiple
  of ``G``. With several envs (shards), group ids are renumbered so they stay unique.
* **Continuous collection.** Sub-envs never wait: an episode may span a batch boundary (and a weight
  update), so every step records the engine ``version`` that generated it and a trajectory lists its
  per-step versions (``RolloutBatch.versions`` keeps the oldest).
* **Overlap** (``overlap=True``, two or more envs): a shard's ``env.step`` (tools, verifiers) runs in a
  background thread while the engine generates for the next shard.
* **Failures** (the policy per fault is in ``docs/collector.md``). Every completion is checked before any env
  sees it (:func:`~gym_llm_adapters.engines.validate.check_completions`): an engine that raises or returns a bad
  completion (:class:`~gym_llm_adapters.engines.validate.EngineOutputError`) costs the call, nothing is stepped,
  and the collector goes on at the next call. A fault after a shard's envs were stepped (an env or its reward
  raising, recording a step failing) is recovered from as the Ray collector recovers from a failed env worker, by
  the same :class:`~gym_llm_adapters.faults.RestartBudget`: the shard restarts from a fresh reset with fresh group
  ids, its in-flight episodes and the finished episodes of its incomplete groups are dropped (counted in
  ``stats.episodes_dropped`` / ``episodes_orphaned``), one warning names the cause; past ``max_env_restarts`` per
  shard, or on Ctrl-C, the collector refuses every call (naming the cause and the fix) until :meth:`reset`. No
  partial or mislabelled trajectory is ever returned. A failed write (``ENOSPC``, Ctrl-C) leaves nothing of the
  batch on disk and the batch is kept (:class:`~gym_llm_adapters.faults.HeldBatch`): the next :meth:`next_batch`
  writes and returns it first.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Literal, Mapping, Sequence

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from gym_llm_adapters.collector_envs import action_length, check_settings, env_mode, obs_at, vocab_size
from gym_llm_adapters.collector_stats import CollectorStats
from gym_llm_adapters.collector_steps import _Shard, _ShardSteps
from gym_llm_adapters.collector_tree import TreeState, check_tree_envs
from gym_llm_adapters.engines.base import Engine, SamplingConfig
from gym_llm_adapters.env_spec import register_spec, spec_of_env
from gym_llm_adapters.episodes import GroupBuffer, info_at
from gym_llm_adapters.faults import CollectorBrokenError, HeldBatch, RestartBudget
from gym_llm_adapters.reward_stages import apply_stages, check_stage_tasks
from gym_llm_adapters.rollout_io import RolloutWriter
from gym_llm_adapters.types import StepRecord, Trajectory

__all__ = ["Collector", "CollectorStats"]

logger = logging.getLogger(__name__)
_RESTART_SEED_SHIFT = 1 << 40  # a restarted shard's seeds: far from every seed the run used before


class Collector(_ShardSteps):
    """Collects rollouts from gym_llm vector envs with an engine.

    Args:
        envs: a vector env, or several (shards; needed for ``overlap``). Text or tokens mode, made with
            ``gym.make_vec`` or a gym_llm vector env class; autoreset ``SAME_STEP`` or ``NEXT_STEP``.
        engine: any :class:`~gym_llm_adapters.engines.base.Engine`.
        sampling: how to sample; ``n`` must be 1 (GRPO groups come from the env's ``group_size``).
        episodes_per_batch: episodes mode: trajectories per batch, a multiple of the group size.
        steps_per_batch: steps mode: step records per batch. Give exactly one of the two.
        seed: seeds the envs' first reset (shard ``k`` gets ``seed + offset_k``) and, when
            ``sampling.seed`` is None, the engine's sampling (a distinct seed range per generate call).
            None: unseeded.
        overlap: run each shard's ``env.step`` in a background thread while the engine generates for
            the next shard (useful when tools/verifiers are slow).
        writer: a :class:`~gym_llm_adapters.rollout_io.RolloutWriter`; every batch is appended and
            fsynced before it is yielded. The file also gets each env's recipe (:mod:`gym_llm_adapters.env_spec`;
            every record names it in ``spec_id``), so ``gym-llm replay FILE`` can replay its episodes.
        progress: show a tqdm progress bar (off by default in library use).
        max_batches: stop iterating after this many batches (None: iterate forever).
        tokenizer: for text-mode observations and decoded prompt text (default: ``engine.tokenizer``).
        record_prompt_text: decode the prompt into each step record's ``prompt_text`` in tokens mode
            (text mode always keeps the observation text).
        max_env_restarts: restarts from a fresh reset allowed per env (shard) after its step or reward raised
            (module docstring, "Failures"); 0 refuses at the first failure.
        branch_turn: tree rollouts (:mod:`gym_llm_adapters.collector_tree`): each group's first member plays alone
            for ``branch_turn`` turns, then the group's other members continue forks of its episode, so a group's
            trajectories share those turns (``Trajectory.shared_turns``; context, not trained) and GRPO compares
            continuations of one state. Needs gym_llm's native vector envs with ``group_size >= 2``, episodes mode.
        reward_stages: trajectory-level rewards run on every batch of whole groups before it is written or returned
            (:mod:`gym_llm_adapters.reward_stages`: an LLM judge, a group judge, a reward model); episodes mode. Each
            trajectory records each stage's score with its source (``Trajectory.scores``); a failed one marks the
            episode's reward failed (``Trajectory.reward_failed``: counted in ``stats.reward_failed``, left out of
            the loss by the trainer). Every stage is tried on each env's first task when the collector is made.
        env_reward_weight: the env's own reward's weight beside the stages' (``Trajectory.env_weight``).

    Iterate it (``for batch in collector``) or call :meth:`next_batch`; a batch is a
    ``list[Trajectory]`` (episodes mode) or a ``list[StepRecord]`` (steps mode). :meth:`run_episodes` instead
    runs exactly one episode per sub-env from a fresh reset (evaluation, or serving a given batch of tasks).
    """

    def __init__(
        self,
        envs: VectorEnv | Sequence[VectorEnv],
        engine: Engine,
        sampling: SamplingConfig,
        *,
        episodes_per_batch: int | None = None,
        steps_per_batch: int | None = None,
        seed: int | None = 0,
        overlap: bool = False,
        writer: RolloutWriter | None = None,
        progress: bool = False,
        max_batches: int | None = None,
        tokenizer: Any = None,
        record_prompt_text: bool = True,
        max_env_restarts: int = 3,
        branch_turn: int | None = None,
        reward_stages: Sequence[Any] = (),
        env_reward_weight: float = 1.0,
    ):
        env_list = [envs] if isinstance(envs, VectorEnv) else list(envs)
        check_settings(env_list, sampling, episodes_per_batch, steps_per_batch)
        if branch_turn is not None:
            check_tree_envs(env_list, branch_turn, mode="episodes" if episodes_per_batch is not None else "steps",
                            overlap=overlap)
        self.branch_turn = branch_turn
        self.engine = engine
        self.sampling = sampling
        self.tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        self.mode: Literal["episodes", "steps"] = "episodes" if episodes_per_batch is not None else "steps"
        self.batch_size = int(episodes_per_batch if episodes_per_batch is not None else steps_per_batch)
        if self.batch_size < 1:
            raise ValueError(f"The batch size must be >= 1, got {self.batch_size}.")
        self._shards = self._make_shards(env_list)
        group_sizes = {s.group_size for s in self._shards}
        self.group_size = max(group_sizes)
        if len(group_sizes) != 1:
            raise ValueError(f"All envs must have the same group_size, got {sorted(group_sizes)}.")
        if self.mode == "episodes" and self.batch_size % self.group_size:
            raise ValueError(
                f"episodes_per_batch={self.batch_size} must be a multiple of the envs' group_size={self.group_size} "
                "(a batch holds whole GRPO groups)."
            )
        if any(s.mode == "text" for s in self._shards) and self.tokenizer is None:
            raise ValueError("Text-mode envs need a tokenizer to encode observations: pass tokenizer= or use an engine with one.")
        self.seed = seed
        self.writer = writer
        self.progress = progress
        self.max_batches = max_batches
        self.record_prompt_text = record_prompt_text
        self.stats = CollectorStats()
        self._faults = RestartBudget(max_env_restarts, unit="env shard", option="max_env_restarts", stats=self.stats)
        self._next_group_offset = sum(s.num_envs // s.group_size for s in self._shards)
        self._executor = ThreadPoolExecutor(len(self._shards), thread_name_prefix="collector_env") if overlap else None
        if overlap and len(self._shards) < 2:
            logger.warning("overlap=True with one env has nothing to overlap; pass two or more envs (shards).")
        self._seed_stride = max(s.num_envs for s in self._shards)
        self._calls = 0
        self._turn = 0
        self._started = False
        self._broken: BaseException | None = None
        self._held = HeldBatch()
        self._groups = GroupBuffer(self.group_size)
        self._steps: list[StepRecord] = []
        self._finished: dict[int, Trajectory] = {}
        self._bar: Any = None
        self._warned_clip = False
        self.reward_stages = list(reward_stages)
        self.env_reward_weight = float(env_reward_weight)
        self._tasks: dict[int, Any] = {}
        if self.reward_stages:
            self._check_stages()

    # ------------------------------------------------------------------------------ setup
    def _make_shards(self, envs: list[VectorEnv]) -> list[_Shard]:
        shards, offset, group_offset = [], 0, 0
        for env in envs:
            mode = env_mode(env)
            autoreset = AutoresetMode(env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
            if autoreset == AutoresetMode.DISABLED:
                raise ValueError(
                    "The collector needs an autoresetting vector env; this one has autoreset_mode=DISABLED. Make it "
                    "with autoreset_mode='SameStep' (gym_llm's default) or 'NextStep'."
                )
            group_size = int(getattr(env, "group_size", None) or getattr(env.unwrapped, "group_size", 1))
            longest_action = action_length(env, mode)
            if mode == "tokens" and self.sampling.max_tokens > longest_action:
                raise ValueError(
                    f"sampling.max_tokens={self.sampling.max_tokens} exceeds the env's longest action "
                    f"({longest_action} tokens); lower max_tokens or raise the env's max_action_tokens."
                )
            spec = getattr(env, "spec", None) or getattr(env.unwrapped, "spec", None)
            env_id = getattr(spec, "id", None) or type(env.unwrapped).__name__
            shards.append(_Shard(env, offset, group_offset, group_size, mode, autoreset, longest_action,
                                 vocab_size(env, mode), env_id, self._record_spec(env, mode, longest_action)))
            offset += int(env.num_envs)
            group_offset += int(env.num_envs) // group_size
        return shards

    def _record_spec(self, env: VectorEnv, mode: str, longest_action: int) -> str:
        """The id of ``env``'s recipe (what a rollout file records so that its episodes can be replayed:
        :mod:`gym_llm_adapters.env_spec`), registered for the writers of this process."""
        try:
            spec = spec_of_env(env, mode=mode, action_length=longest_action, tokenizer=self.tokenizer)
        except Exception as e:  # never let bookkeeping stop a collection; those records will not replay
            logger.warning("Cannot record the spec of %s (%s: %s); its rollouts will not be replayable.",
                           type(env.unwrapped).__name__, type(e).__name__, e)
            return ""
        register_spec(spec)
        return spec.spec_id

    def reset(self, seed: int | None = None, *,
              options: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None) -> None:
        """Start over: reset every env (with ``seed``, default the constructor's) and drop partial episodes.

        ``options`` go to ``env.reset``: one dict for every env, or a sequence with one per env (shard).
        """
        if seed is not None:
            self.seed = seed
        if options is None or isinstance(options, Mapping):
            per_shard = [options] * len(self._shards)
        else:
            per_shard = list(options)
            if len(per_shard) != len(self._shards):
                raise ValueError(f"options must be one dict or one per env ({len(self._shards)}), got {len(per_shard)}.")
        for shard, shard_options in zip(self._shards, per_shard):
            self._reset_shard(shard, None if self.seed is None else self.seed + shard.offset, shard_options)
        self._groups = GroupBuffer(self.group_size)
        self._steps = []
        self._broken = None
        self._faults.reset()
        self._started = True
        self._calls = self._turn = 0  # the same seed gives the same rollouts

    def _reset_shard(self, shard: _Shard, seed: int | None, options: Mapping[str, Any] | None = None) -> None:
        """Abandon the shard's in-flight step and episodes; reset its env and start every sub-env's episode."""
        if shard.future is not None:
            shard.future.cancel()
            try:
                shard.future.result()
            except BaseException:  # the step is abandoned with the rest of the state
                pass
            shard.future = shard.inflight = None
        observations, infos = shard.env.reset(seed=seed, options=None if options is None else dict(options))
        shard.prompts, shard.texts = [None] * shard.num_envs, [""] * shard.num_envs
        shard.builders = [None] * shard.num_envs
        shard.pending_reset = np.zeros(shard.num_envs, dtype=bool)
        for i in range(shard.num_envs):
            self._start_episode(shard, i, obs_at(observations, i), info_at(infos, i))
        if self.branch_turn is not None:
            if shard.tree is None:
                shard.tree = TreeState(self.branch_turn, shard.group_size, shard.num_envs)
            shard.tree.start(shard)

    def _failed(self, shard: _Shard, cause: BaseException) -> None:
        """A fault after ``shard``'s envs were stepped: restart the shard (dropping what it had in flight) within the
        restart budget, else refuse every call until :meth:`reset` (module docstring, "Failures")."""
        if shard.idle is not None or not isinstance(cause, Exception):  # run_episodes, or Ctrl-C: no recovery
            self._broken = cause
            raise cause
        index = self._shards.index(shard)
        dropped = sum(b is not None for b in shard.builders)
        first = shard.group_offset
        last = first + shard.num_envs // shard.group_size
        orphaned = self._groups.drop_open(lambda key: first <= key[0] < last) if self.mode == "episodes" else 0

        def restart() -> None:
            shard.group_offset = self._next_group_offset  # fresh ids: no clash with the dropped groups' rounds
            self._next_group_offset += shard.num_envs // shard.group_size
            restarts = self._faults.restarts.get(index, 0)
            seed = None if self.seed is None else self.seed + shard.offset + restarts * _RESTART_SEED_SHIFT
            self._reset_shard(shard, seed)

        try:
            self._faults.failed(index, cause, dropped=dropped, orphaned=orphaned, restart=restart)
        except BaseException as e:  # refused (past the budget), or the reset itself failed
            self._broken = e
            raise

    # ---------------------------------------------------------------------------- batches
    def __iter__(self) -> Iterator[list[Trajectory] | list[StepRecord]]:
        while self.max_batches is None or self.stats.batches < self.max_batches:
            yield self.next_batch()

    def next_batch(self) -> list[Trajectory] | list[StepRecord]:
        """Step the envs until a full batch is ready; write it (if a writer is set) and return it."""
        self._check_not_broken()
        start = time.perf_counter()
        try:
            batch = self._held.take()  # a batch whose write failed goes first, as it was
            if batch is None:
                if not self._started:
                    self.reset()
                self._open_progress()
                while not self._batch_ready():
                    self.advance()
                batch = self._take_batch()
            self._held.score(batch, self._score)  # held until scored: a reward stage that raises loses nothing
            self._held.write(self.writer, batch)  # held until it is on disk: a failed write loses nothing
            self.stats.batches += 1
            self._tick(len(batch))
            return batch
        finally:
            self.stats.wall_s += time.perf_counter() - start
            if self._bar is not None:
                self._bar.set_postfix(tok_s=f"{self.stats.tokens_per_s:.0f}", ep_s=f"{self.stats.episodes_per_s:.2f}")

    def advance(self) -> None:
        """One vector step of the next env (shard, round-robin): generate for its sub-envs, step it, and
        record the results (step records and finished trajectories go to the batch buffers, or to the
        sinks a subclass redirects them to: :meth:`_on_step`, :meth:`_on_episode`). :meth:`next_batch`
        calls it until a batch is ready; the Ray env workers call it directly."""
        self._check_not_broken()
        if not self._started:
            self.reset()
        shard = self._shards[self._turn % len(self._shards)]
        self._turn += 1
        self._advance(shard)

    def _check_not_broken(self) -> None:
        if self._broken is not None:
            if isinstance(self._broken, CollectorBrokenError):
                raise CollectorBrokenError(str(self._broken)) from self._broken
            raise CollectorBrokenError(
                f"An env step failed earlier ({type(self._broken).__name__}: {self._broken}); the envs' state is "
                "unknown. Call collector.reset() to start over."
            ) from self._broken

    def collect(self, num_batches: int) -> list[list[Trajectory] | list[StepRecord]]:
        """The next ``num_batches`` batches as a list."""
        return [self.next_batch() for _ in range(num_batches)]

    def run_episodes(self, *, seed: int | None = None,
                     options: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None) -> list[Trajectory]:
        """Run exactly one episode in every sub-env, from a fresh reset; return them in sub-env order.

        Every env is reset (``seed`` and ``options`` as in :meth:`reset`; e.g. ``options={"task_ids": [...]}``
        picks each sub-env's task in gym_llm vector envs), then stepped until each sub-env's first episode has
        ended. A sub-env whose episode has ended idles: nothing more is generated for it and it gets an empty
        action while the others finish (the env may run throwaway episodes there; they are not recorded). The
        writer, if any, gets the trajectories as one batch. The batch size does not apply, and the next
        :meth:`next_batch` starts from a fresh reset.

        Returns ``sum(num_envs)`` trajectories; ``trajectories[k].env_index == k``.
        """
        if self.branch_turn is not None:
            raise ValueError("run_episodes() runs one flat episode per sub-env; make a collector without branch_turn "
                             "for it.")
        start = time.perf_counter()
        self.reset(seed=seed, options=options)
        self._finished = {}
        for shard in self._shards:
            shard.idle = np.zeros(shard.num_envs, dtype=bool)
        try:
            while any(shard.future is not None or not shard.idle.all() for shard in self._shards):
                self.advance()
        finally:
            for shard in self._shards:
                shard.idle = None
            self._started = False  # the envs hold throwaway episodes now: start over next time
            self.stats.wall_s += time.perf_counter() - start
        trajectories = [self._finished[k] for k in sorted(self._finished)]
        self._finished = {}
        if self.writer is not None:
            try:
                self.writer.write(trajectories)
            except BaseException as e:  # nothing of them is on disk; the caller still gets them with the error
                e.trajectories = trajectories  # type: ignore[attr-defined]
                e.add_note(f"The {len(trajectories)} trajectories of this run_episodes() call were not written; they "
                           "are on this exception's .trajectories.")
                raise
        return trajectories

    def _batch_ready(self) -> bool:
        if self.mode == "episodes":
            return self._groups.num_ready >= self.batch_size
        return len(self._steps) >= self.batch_size

    def _take_batch(self) -> list[Any]:
        if self.mode == "episodes":
            return self._groups.pop(self.batch_size)
        batch, self._steps = self._steps[: self.batch_size], self._steps[self.batch_size:]
        return batch

    def _score(self, batch: list[Any]) -> None:
        """The reward stages on a batch of whole groups (episodes mode), and its failed rewards counted."""
        if self.mode != "episodes":
            return
        if self.reward_stages:
            start = time.perf_counter()
            apply_stages(batch, [self._task_of(t) for t in batch], self.reward_stages, self.env_reward_weight)
            self.stats.reward_stage_s += time.perf_counter() - start
        self.stats.reward_failed += sum(t.reward_failed for t in batch)

    # ------------------------------------------------------------------------------ reward stages
    def _shard_tasks(self, shard: _Shard) -> Any:
        key = id(shard.env)
        if key not in self._tasks:
            parts = getattr(shard.env, "parts", None)
            if parts is None and hasattr(shard.env, "get_attr"):
                try:
                    parts = shard.env.get_attr("parts")[0]
                except Exception:  # noqa: BLE001  (not a gym_llm env underneath)
                    parts = None
            if parts is None or not hasattr(parts, "tasks"):
                raise ValueError(f"Reward stages read each episode's task from its env; {shard.env_id or shard.env!r} "
                                 "is not a gym_llm env (no .parts.tasks). Use gym_llm's vector envs "
                                 "(gym.make_vec(id, vectorization_mode='vector_entry_point')) or a SyncVectorEnv of "
                                 "gym_llm envs.")
            self._tasks[key] = parts.tasks
        return self._tasks[key]

    def _task_of(self, trajectory: Trajectory) -> Any:
        for shard in self._shards:
            if shard.offset <= trajectory.env_index < shard.offset + shard.num_envs:
                return self._shard_tasks(shard)[trajectory.task_id]
        raise RuntimeError(f"No env holds sub-env {trajectory.env_index} (a trajectory this collector did not make).")

    def _check_stages(self) -> None:
        """Refuse, before any rollout, reward stages that cannot run here: steps mode, a stage without the
        interface, an env without tasks, or a stage whose judge prompt cannot be built from an env's tasks."""
        if self.mode != "episodes":
            raise ValueError("reward_stages score whole episodes: use episodes_per_batch=, not steps_per_batch=.")
        for stage in self.reward_stages:
            if not (hasattr(stage, "score") and hasattr(stage, "source") and hasattr(stage, "weight")):
                raise TypeError(f"A reward stage needs .score(trajectories, tasks), .source and .weight; got "
                                f"{type(stage).__name__} (see gym_llm_adapters.reward_stages).")
        for shard in self._shards:
            tasks = self._shard_tasks(shard)
            for stage in self.reward_stages:
                check_stage_tasks(stage, tasks, shard.env_id)

    # ------------------------------------------------------------------------------- misc
    def _open_progress(self) -> None:
        if self.progress and self._bar is None:
            from tqdm.auto import tqdm

            total = self.max_batches * self.batch_size if self.max_batches is not None else None
            self._bar = tqdm(total=total, unit="episode" if self.mode == "episodes" else "step", desc="collect")

    def _tick(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        """Stop the background threads and the progress bar (the envs and engine stay open)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        for shard in self._shards:
            if shard.tree is not None:
                shard.tree.close()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Collector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
