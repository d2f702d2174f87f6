"""The Ray collector: env workers and engines as Ray actors, batches gathered on the driver.

::

    driver (RayCollector)                      env worker k (EnvWorker actor)          engine actor e
    ───────────────────────                    ──────────────────────────────          ──────────────
    poll(engine e, steps) ───────────────────► local Collector.advance() ────────────► generate(prompts)
    finished trajectories / steps  ◄────────── env.step, EpisodeBuilder (token-exact) ◄─ completions + version
    per-worker GroupBuffer → whole groups → batch;  load_weights: one object-store copy ──► every engine

Every worker always has one poll in flight, so env steps (tools, verifiers, sandboxes) of different workers
run in parallel and keep running while the trainer works on a batch. Batches are what the local
:class:`~gym_llm_adapters.collector.Collector` yields: ``list[Trajectory]`` made of whole GRPO groups (episodes
mode) or ``list[StepRecord]`` (steps mode), token-exact, each step tagged with the engine version that
generated it. Sub-env ``env_index`` and ``group_id`` are numbered across workers; a restarted worker gets fresh
group ids.

Seeds. Worker ``k`` (sub-envs ``offset_k ...``) resets with ``seed + offset_k`` and its ``j``-th generate call
samples with ``seed + (j * K + k) * N`` — exactly the seeds of a local collector over the same ``K`` envs
(``N`` sub-envs each), so with ``ordered=True`` the two yield identical batches (tested).

Failures (see ``docs/ray.md``):

* an env worker that dies (or whose env raises, or that exceeds ``worker_timeout_s``) is killed and
  replaced, up to ``max_worker_restarts`` times per worker. Its in-flight episodes are dropped
  (``stats.episodes_dropped``), and so are finished episodes of its groups that can no longer complete
  (``stats.episodes_orphaned``): nothing half-done is emitted. The replacement resets with new seeds. In steps
  mode, the steps those episodes had already taken stay emitted (or are emitted from the buffer): each is a
  correct step, but the episode never gets its final step (see ``docs/ray.md``, "Failure policy").
* an engine actor that dies is replaced by its :class:`~gym_llm_adapters.ray.engines.EngineGroup` (up to
  ``max_engine_restarts``) at the current version with the latest weights, and the interrupted calls are
  retried: nothing is lost. Past the limit, :class:`~gym_llm_adapters.ray.specs.EngineDiedError`.
* an engine call that raises inside a live engine (bad input) raises
  :class:`~gym_llm_adapters.ray.specs.EngineCallError`; nothing is recorded and ``next_batch()`` may be called
  again.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from gym_llm_adapters.collector import CollectorStats
from gym_llm_adapters.engines.base import SamplingConfig
from gym_llm_adapters.engines.validate import EngineOutputError
from gym_llm_adapters.env_spec import RecordedEnvSpec, register_spec
from gym_llm_adapters.episodes import GroupBuffer
from gym_llm_adapters.faults import HeldBatch, RestartBudget, root_cause
from gym_llm_adapters.ray.engines import EngineGroup
from gym_llm_adapters.ray.specs import (EngineCallError, EngineDiedError, EngineSpec, EngineUnavailableError,
                                        EnvSpec, EnvWorkerDiedError, require_ray)
from gym_llm_adapters.ray.worker import EnvWorker, WorkerReport
from gym_llm_adapters.reward_stages import apply_stages, check_stage_tasks
from gym_llm_adapters.rollout_io import RolloutWriter
from gym_llm_adapters.types import StepRecord, Trajectory

__all__ = ["RayCollector", "RayCollectorStats"]

logger = logging.getLogger(__name__)
_RESTART_SEED_SHIFT = 1 << 40  # a replacement worker's seeds: far from every seed the run used before


@dataclass
class RayCollectorStats(CollectorStats):
    """:class:`~gym_llm_adapters.collector.CollectorStats` summed over the workers, plus failure counters.

    ``generate_s`` and ``env_s`` add up over workers (they run in parallel, so they may exceed ``wall_s``).
    """

    worker_restarts: int = 0
    engine_restarts: int = 0


@dataclass(eq=False)
class _WorkerSlot:
    index: int
    engine_index: int
    num_envs: int
    env_offset: int
    group_offset: int
    groups: GroupBuffer
    actor: Any = None
    ref: Any = None  # the one call in flight (start or poll)
    deadline_s: float | None = None  # monotonic time after which the call counts as hung
    inflight: int = 0
    restarts: int = 0


class RayCollector:
    """Collects rollouts with env workers and engines running as Ray actors (call ``ray.init`` first).

    Args:
        env: an :class:`~gym_llm_adapters.ray.specs.EnvSpec` (env id + ``gym.make_vec`` arguments, or a factory),
            or a factory returning a vector env; every worker builds one.
        engines: an :class:`~gym_llm_adapters.ray.engines.EngineGroup` (shared, not closed by the collector), or
            an :class:`~gym_llm_adapters.ray.specs.EngineSpec` to start ``num_engines`` actors owned by the
            collector. Worker ``k`` uses engine ``k % E``.
        sampling: as for the local collector (``n`` must be 1).
        num_workers: env worker actors.
        episodes_per_batch / steps_per_batch: exactly one; as for the local collector.
        seed: seeds resets and sampling (see the module docstring); None: unseeded.
        steps_per_poll: vector steps a worker runs per call (more amortises the call's ~ms overhead; fewer
            gives fresher versions).
        ordered: consume the workers' results round-robin instead of as they come: batches are then
            reproducible (equal to a local collector's over the same envs) at the cost of waiting for the
            slowest worker.
        writer: a :class:`~gym_llm_adapters.rollout_io.RolloutWriter`; each batch is written before it is returned.
        max_batches: iteration stops after this many batches.
        tokenizer: for text-mode observations and prompt text (default: the engines' tokenizer).
        record_prompt_text: as for the local collector.
        worker_options / engine_options: Ray actor options (``num_cpus``, ``num_gpus``, ``resources``,
            ``scheduling_strategy``, ``runtime_env``, ...).
        max_worker_restarts: replacements allowed per worker before :class:`EnvWorkerDiedError`.
        max_engine_restarts: replacements allowed per engine actor when ``engines`` is a spec (a shared
            :class:`~gym_llm_adapters.ray.engines.EngineGroup` has its own ``max_restarts``; both default to 1).
        worker_timeout_s: a poll running longer than this counts as a dead worker (None: wait forever). A
            (re)starting worker has ``start_timeout_s`` instead.
        start_timeout_s: how long actors may take to be placed and start.
        reward_stages / env_reward_weight: as for the local collector (:mod:`gym_llm_adapters.reward_stages`): run on
            the driver on every batch of whole groups; the tasks come from one env built on the driver from ``env``.
    """

    def __init__(
        self,
        env: EnvSpec | Callable[..., Any],
        engines: EngineGroup | EngineSpec,
        sampling: SamplingConfig,
        *,
        num_workers: int = 1,
        num_engines: int = 1,
        episodes_per_batch: int | None = None,
        steps_per_batch: int | None = None,
        seed: int | None = 0,
        steps_per_poll: int = 1,
        ordered: bool = False,
        writer: RolloutWriter | None = None,
        max_batches: int | None = None,
        tokenizer: Any = None,
        record_prompt_text: bool = True,
        worker_options: Mapping[str, Any] | None = None,
        engine_options: Mapping[str, Any] | None = None,
        max_worker_restarts: int = 3,
        max_engine_restarts: int = 1,
        worker_timeout_s: float | None = None,
        start_timeout_s: float = 600.0,
        reward_stages: Any = (),
        env_reward_weight: float = 1.0,
    ):
        ray = require_ray()
        self._check_args(sampling, episodes_per_batch, steps_per_batch, num_workers, steps_per_poll, max_worker_restarts)
        self.env_spec = env if isinstance(env, EnvSpec) else EnvSpec(env)
        self.sampling, self.seed, self.steps_per_poll, self.ordered = sampling, seed, steps_per_poll, ordered
        self.mode = "episodes" if episodes_per_batch is not None else "steps"
        self.batch_size = int(episodes_per_batch if episodes_per_batch is not None else steps_per_batch)
        self.writer, self.max_batches, self.record_prompt_text = writer, max_batches, record_prompt_text
        self.max_worker_restarts, self.worker_timeout_s = max_worker_restarts, worker_timeout_s
        self.start_timeout_s = float(start_timeout_s)
        self.stats = RayCollectorStats()
        # the local Collector's failure policy, with an env worker as the unit (gym_llm_adapters.faults)
        self._faults = RestartBudget(max_worker_restarts, unit="env worker", option="max_worker_restarts",
                                     stats=self.stats)
        self._held = HeldBatch()
        self._slots: list[_WorkerSlot] = []
        self._ready: collections.deque[list[Trajectory]] = collections.deque()
        self._num_ready = 0
        self._steps: list[StepRecord] = []
        self._turn = 0
        self._broken: BaseException | None = None
        self._closed = False
        self._owns_engines = isinstance(engines, EngineSpec)
        if isinstance(engines, EngineSpec):
            engines = EngineGroup(engines, num_engines, actor_options=engine_options, max_restarts=max_engine_restarts,
                                  start_timeout_s=start_timeout_s)
        elif not isinstance(engines, EngineGroup):
            raise TypeError(f"engines must be an EngineGroup or an EngineSpec, got {type(engines).__name__}.")
        self.engines = engines
        self._worker_cls = ray.remote(EnvWorker).options(**dict(worker_options or {}))
        self.reward_stages, self.env_reward_weight = list(reward_stages), float(env_reward_weight)
        self._stage_tasks: Any = None
        if self.reward_stages:
            if self.mode != "episodes":
                raise ValueError("reward_stages score whole episodes: use episodes_per_batch=, not steps_per_batch=.")
            self._stage_tasks = self._tasks_on_driver()
            for stage in self.reward_stages:
                check_stage_tasks(stage, self._stage_tasks, str(self.env_spec.env))
        try:
            self.tokenizer = tokenizer if tokenizer is not None else engines.tokenizer
            self._start_workers(num_workers)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _check_args(sampling: Any, episodes_per_batch: Any, steps_per_batch: Any, num_workers: Any,
                    steps_per_poll: Any, max_worker_restarts: Any) -> None:
        if not isinstance(sampling, SamplingConfig):
            raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}.")
        if sampling.n != 1:
            raise ValueError(f"The collector samples one completion per sub-env (sampling.n=1), got n={sampling.n}; "
                             "for GRPO groups make the env with group_size=G.")
        if (episodes_per_batch is None) == (steps_per_batch is None):
            raise ValueError("Give exactly one of episodes_per_batch= (episodes mode) or steps_per_batch= (steps mode).")
        checks = (("batch size", episodes_per_batch or steps_per_batch, 1), ("num_workers", num_workers, 1),
                  ("steps_per_poll", steps_per_poll, 1), ("max_worker_restarts", max_worker_restarts, 0))
        for name, value, low in checks:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"RayCollector {name} must be an int >= {low}, got {value!r}.")

    # ------------------------------------------------------------------------------ workers
    def _start_workers(self, num_workers: int) -> None:
        import ray

        actors = [self._worker_cls.remote() for _ in range(num_workers)]
        self._slots = []  # filled below; close() ends the actors if anything fails
        self._pending_actors = actors
        try:
            infos = ray.get([a.build.remote(self.env_spec) for a in actors], timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"{num_workers} env worker(s) did not start within start_timeout_s={self.start_timeout_s:.0f}; free in "
                f"the cluster: {ray.available_resources()}. Lower num_workers / worker_options or add nodes.") from None
        group_sizes = {info.group_size for info in infos}
        if len(group_sizes) != 1:
            raise ValueError(f"All env workers must have the same group_size, got {sorted(group_sizes)}.")
        self.group_size = group_sizes.pop()
        if self.mode == "episodes" and self.batch_size % self.group_size:
            raise ValueError(f"episodes_per_batch={self.batch_size} must be a multiple of the envs' group_size="
                             f"{self.group_size} (a batch holds whole GRPO groups).")
        if any(info.mode == "text" for info in infos) and self.tokenizer is None:
            raise ValueError("Text-mode envs need a tokenizer: pass tokenizer= or use engines that have one.")
        self._seed_stride = max(info.num_envs for info in infos)
        env_offset = group_offset = 0
        for k, (actor, info) in enumerate(zip(actors, infos)):
            self._slots.append(_WorkerSlot(k, k % self.engines.num_engines, info.num_envs, env_offset, group_offset,
                                           GroupBuffer(self.group_size, queue=False), actor))
            env_offset += info.num_envs
            group_offset += info.num_envs // self.group_size
        self._next_group_offset = group_offset
        self._pending_actors = []
        for slot in self._slots:
            self._submit_start(slot, incarnation=0)
        for slot, report in zip(self._slots, ray.get([s.ref for s in self._slots], timeout=self.start_timeout_s)):
            slot.ref = None
            self._absorb(slot, report)
        for slot in self._slots:
            self._submit_poll(slot)

    def _submit_start(self, slot: _WorkerSlot, incarnation: int) -> None:
        shift = incarnation * _RESTART_SEED_SHIFT
        sampling = self.sampling
        if sampling.seed is not None:
            sampling = dataclasses.replace(sampling, seed=sampling.seed + slot.env_offset + shift)
        seed = None if self.seed is None else self.seed + slot.env_offset + shift
        slot.ref = slot.actor.start.remote(
            sampling, want=self.mode, seed=seed, seed_stride=len(self._slots) * self._seed_stride,
            env_offset=slot.env_offset, group_offset=slot.group_offset, tokenizer=self.tokenizer,
            record_prompt_text=self.record_prompt_text)
        slot.deadline_s = time.monotonic() + self.start_timeout_s

    def _submit_poll(self, slot: _WorkerSlot) -> None:
        slot.ref = slot.actor.poll.remote(self.engines.handle(slot.engine_index), slot.engine_index, self.steps_per_poll)
        slot.deadline_s = None if self.worker_timeout_s is None else time.monotonic() + self.worker_timeout_s

    def _restart_worker(self, slot: _WorkerSlot, cause: BaseException) -> None:
        """Drop what the worker had in flight, end it, and start a replacement (or raise past the limit)."""
        import ray

        dropped, orphaned = slot.inflight, slot.groups.num_open
        with contextlib.suppress(Exception):
            ray.kill(slot.actor, no_restart=True)
        slot.ref, slot.inflight = None, 0
        slot.groups = GroupBuffer(self.group_size, queue=False)

        def restart() -> None:
            slot.restarts += 1
            self.stats.worker_restarts += 1
            slot.group_offset = self._next_group_offset  # fresh group ids: no clash with the dead worker's groups
            self._next_group_offset += slot.num_envs // self.group_size
            slot.actor = self._worker_cls.remote()
            slot.actor.build.remote(self.env_spec)  # start() raises what build() raised
            self._submit_start(slot, incarnation=slot.restarts)

        try:
            self._faults.failed(slot.index, cause if isinstance(cause, Exception) else RuntimeError(str(cause)),
                                dropped=dropped, orphaned=orphaned, restart=restart)
        except Exception as refused:
            self._broken = EnvWorkerDiedError(str(refused))
            raise self._broken from cause

    # ------------------------------------------------------------------------------ batches
    def __iter__(self) -> Iterator[list[Trajectory] | list[StepRecord]]:
        while self.max_batches is None or self.stats.batches < self.max_batches:
            yield self.next_batch()

    def next_batch(self) -> list[Trajectory] | list[StepRecord]:
        """Gather results from the workers until a full batch is ready; write it (if a writer is set) and return it."""
        if self._closed:
            raise RuntimeError("This RayCollector is closed.")
        if self._broken is not None:
            raise RuntimeError(f"The collector stopped after a failure it cannot recover from "
                               f"({type(self._broken).__name__}: {self._broken}). Make a new RayCollector.")
        start = time.perf_counter()
        try:
            batch = self._held.take()  # a batch whose write failed goes first, as it was
            if batch is None:
                while not self._batch_ready():
                    self._pump()
                batch = self._take_batch()
            self._held.score(batch, self._score)  # held until scored: a reward stage that raises loses nothing
            self._held.write(self.writer, batch)  # held until it is on disk: a failed write loses nothing
            self.stats.batches += 1
            return batch
        finally:
            self.stats.wall_s += time.perf_counter() - start

    def collect(self, num_batches: int) -> list[list[Trajectory] | list[StepRecord]]:
        """The next ``num_batches`` batches as a list."""
        return [self.next_batch() for _ in range(num_batches)]

    def _batch_ready(self) -> bool:
        return (self._num_ready if self.mode == "episodes" else len(self._steps)) >= self.batch_size

    def _take_batch(self) -> list[Any]:
        if self.mode == "steps":
            batch, self._steps = self._steps[: self.batch_size], self._steps[self.batch_size:]
            return batch
        out: list[Trajectory] = []
        while len(out) < self.batch_size:
            group = self._ready.popleft()
            out.extend(group)
            self._num_ready -= len(group)
        return out

    def _score(self, batch: list[Any]) -> None:
        """The reward stages on a batch of whole groups (episodes mode), and its failed rewards counted."""
        if self.mode == "steps":
            return
        if self.reward_stages:
            start = time.perf_counter()
            apply_stages(batch, [self._stage_tasks[t.task_id] for t in batch], self.reward_stages,
                         self.env_reward_weight)
            self.stats.reward_stage_s += time.perf_counter() - start
        self.stats.reward_failed += sum(t.reward_failed for t in batch)

    def _tasks_on_driver(self) -> Any:
        """The env's tasks, from one env built here (the workers' envs are built from the same spec)."""
        spec = self.env_spec
        if isinstance(spec.env, str):  # one group's worth of sub-envs: the tasks are the same whatever the count
            spec = EnvSpec(spec.env, num_envs=int(spec.kwargs.get("group_size", 1)), **spec.kwargs)
        env = spec.build()
        try:
            parts = getattr(env, "parts", None)
            if parts is None and hasattr(env, "get_attr"):
                parts = env.get_attr("parts")[0]
            if parts is None:
                raise ValueError(f"Reward stages read each episode's task from its env; {spec.env!r} is not a gym_llm "
                                 "env (no .parts.tasks).")
            return parts.tasks
        finally:
            env.close()

    def _pump(self) -> None:
        """Take one worker result (the next in turn when ``ordered``, else the first to finish) and resubmit."""
        import ray

        for slot in self._slots:
            if slot.ref is None:  # idle after an engine call error
                self._submit_poll(slot)
        if self.ordered:
            slot = self._slots[self._turn % len(self._slots)]
            ready, _ = ray.wait([slot.ref], timeout=self._wait_s([slot]))
        else:
            by_ref = {s.ref: s for s in self._slots}
            ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=self._wait_s(self._slots))
            slot = by_ref[ready[0]] if ready else None
        if not ready:
            self._restart_overdue()
            return
        self._turn += 1
        ref, slot.ref = slot.ref, None
        try:
            report = ray.get(ref)
        except EngineUnavailableError as e:
            self._engine_died(slot, e)
        except EngineCallError as e:  # the worker is intact; it is resubmitted on the next call
            raise EngineCallError(str(getattr(e, "cause", None) or e)) from None
        except EngineOutputError as e:  # checked before any env step: the worker is intact, as in a local Collector
            cause = getattr(e, "cause", None)
            raise (cause if isinstance(cause, EngineOutputError) else e) from None
        except Exception as e:  # the worker died, or its env raised
            self._restart_worker(slot, e)
        else:
            self._absorb(slot, report)
            self._submit_poll(slot)

    @staticmethod
    def _wait_s(slots: list[_WorkerSlot]) -> float | None:
        deadlines = [s.deadline_s for s in slots if s.deadline_s is not None]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _restart_overdue(self) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if slot.ref is not None and slot.deadline_s is not None and now >= slot.deadline_s:
                self._restart_worker(slot, TimeoutError(
                    f"no answer within worker_timeout_s={self.worker_timeout_s} (start_timeout_s={self.start_timeout_s} "
                    "while starting)"))

    def _engine_died(self, slot: _WorkerSlot, error: BaseException) -> None:
        info = getattr(error, "cause", None) or error
        try:
            self.engines.restart(info.engine_index, dead_actor_id=info.actor_id, cause=info)
        except EngineDiedError as e:
            self._broken = e
            raise
        self.stats.engine_restarts = sum(self.engines.restarts)
        self._submit_poll(slot)  # the worker kept its state: retry the same step on the new engine

    def _absorb(self, slot: _WorkerSlot, report: WorkerReport) -> None:
        for data in report.env_specs:  # the worker's env recipes: this process's writer stores them for replay
            register_spec(RecordedEnvSpec.from_dict(data))
        for record in report.records:
            _own_arrays(record)
        slot.inflight = report.inflight
        for name, value in report.stats.items():
            setattr(self.stats, name, getattr(self.stats, name) + value)
        if self.mode == "steps":
            self._steps.extend(report.records)
            self.stats.episodes += sum(bool(r.terminated or r.truncated) for r in report.records)
            return
        self.stats.episodes += len(report.records)
        for group in slot.groups.add(report.records):
            self._ready.append(group)
            self._num_ready += len(group)

    # ------------------------------------------------------------------------------- misc
    @property
    def workers(self) -> list[Any]:
        """The env worker actor handles (they change when a worker is restarted)."""
        return [s.actor for s in self._slots]

    @property
    def version(self) -> int:
        return self.engines.version

    def load_weights(self, weights: Any) -> int:
        """Broadcast new weights to the engine actors (see :meth:`EngineGroup.load_weights`); the new version."""
        return self.engines.load_weights(weights)

    @property
    def serves_adapters(self) -> bool:
        return self.engines.serves_adapters

    @property
    def adapter(self) -> Any:
        return self.engines.adapter

    def load_adapter(self, adapter: Any) -> int:
        """Ship a LoRA adapter to the engine actors (see :meth:`EngineGroup.load_adapter`); the new version."""
        return self.engines.load_adapter(adapter)

    def close(self, timeout_s: float = 30.0) -> None:
        """Close the envs, end the worker actors and (when the collector started them) the engine actors."""
        import ray

        if self._closed:
            return
        self._closed = True
        actors = [s.actor for s in self._slots] + list(getattr(self, "_pending_actors", []))
        refs = []
        for actor in actors:
            with contextlib.suppress(Exception):
                refs.append(actor.close.remote())
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if self._owns_engines and hasattr(self, "engines"):
            self.engines.close()

    def __enter__(self) -> "RayCollector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _own_arrays(record: Trajectory | StepRecord) -> None:
    """Arrays that come out of Ray's object store are read-only views of shared memory; the batch gets its own
    writable copies (a local collector's records are writable, and torch warns on read-only arrays)."""
    if isinstance(record, Trajectory):
        names = ("token_ids", "policy_mask", "logprobs")
    else:
        names = ("prompt_ids", "completion_ids", "logprobs")
    for name in names:
        value = getattr(record, name)
        if not value.flags.writeable:
            setattr(record, name, value.copy())
    if isinstance(record, Trajectory):
        for step in record.steps:
            _own_arrays(step)
