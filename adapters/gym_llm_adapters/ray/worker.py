"""The env worker: a Ray actor that holds one vector env and runs the local collector's step loop on it.

The worker builds its env from an :class:`~gym_llm_adapters.ray.specs.EnvSpec` and drives it with the local
:class:`~gym_llm_adapters.collector.Collector` (same prompts, actions, autoreset handling, token-exact
:class:`~gym_llm_adapters.episodes.EpisodeBuilder` s, per-step versions), whose engine is a
:class:`~gym_llm_adapters.ray.engines.RemoteEngine` on the worker's engine actor. Instead of batching, each
:meth:`EnvWorker.poll` advances the env ``num_steps`` vector steps and returns the finished trajectories (or
step records), numbered into the worker's global sub-env and group-id range; the driver groups and batches
them. So a trajectory leaves a worker only when its episode is complete.

Failures: an engine error leaves the collector untouched (it happens before the env is stepped) and the
records gathered so far stay in the outbox for the next poll; an env error breaks the worker, which the driver
then replaces.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Literal

from gym_llm_adapters.collector import Collector
from gym_llm_adapters.collector_envs import env_mode
from gym_llm_adapters.engines.base import SamplingConfig
from gym_llm_adapters.env_spec import known_spec
from gym_llm_adapters.ray.engines import RemoteEngine
from gym_llm_adapters.ray.specs import EnvSpec
from gym_llm_adapters.types import StepRecord, Trajectory

__all__ = ["EnvWorker", "EnvInfo", "WorkerReport"]

_FORWARDED_STATS = ("steps", "env_steps", "prompt_tokens", "generated_tokens", "generate_s", "env_s")


@dataclass(frozen=True)
class EnvInfo:
    """What a worker's env looks like (``num_envs`` sub-envs in groups of ``group_size``; ``mode`` text/tokens)."""

    num_envs: int
    group_size: int
    mode: str
    pid: int
    node_ip: str


@dataclass
class WorkerReport:
    """One poll's results.

    Attributes:
        records: finished trajectories (episodes mode) or step records (steps mode), in finishing order.
        inflight: episodes running in the worker's sub-envs after this poll (what a crash now would drop).
        stats: increments of the collector counters (``steps``, ``env_steps``, tokens, ``generate_s``, ``env_s``).
        env_specs: (``start`` only) the recorded specs of the worker's envs (:mod:`gym_llm_adapters.env_spec`, as
            dicts): the driver registers them, so its writer puts them in the rollout file and ``gym-llm replay``
            can rebuild the envs.
    """

    records: list[Any]
    inflight: int
    stats: dict[str, float]
    env_specs: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class _WorkerCollector(Collector):
    """The local collector with its outputs redirected to an outbox and renumbered into the worker's range."""

    def __init__(self, env: Any, engine: RemoteEngine, sampling: SamplingConfig, *, want: Literal["episodes", "steps"],
                 seed: int | None, seed_stride: int, env_offset: int, group_offset: int, tokenizer: Any,
                 record_prompt_text: bool):
        # max_env_restarts=0: a failed env step leaves the worker; the RayCollector restarts the whole worker with
        # the same RestartBudget (gym_llm_adapters.faults) a local Collector uses for a shard
        super().__init__(env, engine, sampling, steps_per_batch=1, seed=seed, tokenizer=tokenizer,
                         record_prompt_text=record_prompt_text, max_env_restarts=0)
        self._seed_stride = seed_stride  # generate call j of worker k seeds like call j*K + k of a local collector
        self.want, self.env_offset, self.group_offset = want, env_offset, group_offset
        self.outbox: list[Any] = []

    def _renumber(self, record: StepRecord | Trajectory) -> None:
        record.env_index += self.env_offset
        record.group_id += self.group_offset

    def _on_step(self, record: StepRecord) -> None:
        if self.want == "steps":
            self._renumber(record)
            self.outbox.append(record)

    def _on_episode(self, trajectory: Trajectory) -> None:
        if self.want == "episodes":
            self._renumber(trajectory)
            for step in trajectory.steps:
                self._renumber(step)
            self.outbox.append(trajectory)

    @property
    def inflight(self) -> int:
        return sum(b is not None for shard in self._shards for b in shard.builders)


class EnvWorker:
    """The body of an env worker actor (wrapped with ``ray.remote`` by the Ray collector).

    Calls, in order: :meth:`build` (make the env, report its shape), :meth:`start` (reset it with the worker's
    seeds and numbering), then :meth:`poll` repeatedly.
    """

    def __init__(self) -> None:
        self._env: Any = None
        self._build_error: BaseException | None = None
        self._collector: _WorkerCollector | None = None
        self._engine = RemoteEngine(None)
        self._reported: dict[str, float] = {}

    def build(self, spec: EnvSpec) -> EnvInfo:
        import ray

        try:
            self._env = spec.build()
        except BaseException as e:
            self._build_error = e
            raise
        env = self._env
        group_size = int(getattr(env, "group_size", None) or getattr(env.unwrapped, "group_size", 1))
        return EnvInfo(int(env.num_envs), group_size, env_mode(env), os.getpid(), ray.util.get_node_ip_address())

    def start(self, sampling: SamplingConfig, *, want: Literal["episodes", "steps"], seed: int | None,
              seed_stride: int, env_offset: int, group_offset: int, tokenizer: Any,
              record_prompt_text: bool) -> WorkerReport:
        """Reset the env (seed ``seed``) and start an episode in every sub-env."""
        if self._env is None:
            raise RuntimeError(f"The env worker has no env; building it failed: {self._build_error!r}")
        self._engine = RemoteEngine(None, tokenizer=tokenizer)
        self._collector = _WorkerCollector(
            self._env, self._engine, sampling, want=want, seed=seed, seed_stride=seed_stride, env_offset=env_offset,
            group_offset=group_offset, tokenizer=tokenizer, record_prompt_text=record_prompt_text)
        self._collector.reset()
        self._reported = {name: 0.0 for name in _FORWARDED_STATS}
        specs = [known_spec(shard.spec_id) for shard in self._collector._shards if shard.spec_id]
        return WorkerReport([], self._collector.inflight, {}, [spec.to_dict() for spec in specs if spec is not None])

    def poll(self, engine: Any, engine_index: int, num_steps: int = 1) -> WorkerReport:
        """Advance ``num_steps`` vector steps with engine actor ``engine``; return what finished.

        An engine failure (:class:`~gym_llm_adapters.ray.specs.EngineUnavailableError` /
        :class:`~gym_llm_adapters.ray.specs.EngineCallError`) propagates with the worker intact: what finished
        before it stays in the outbox for the next poll.
        """
        if self._collector is None:
            raise RuntimeError("EnvWorker.poll before start().")
        self._engine.bind(engine, engine_index)
        for _ in range(num_steps):
            self._collector.advance()
        records, self._collector.outbox = self._collector.outbox, []
        return WorkerReport(records, self._collector.inflight, self._stats_increments())

    def _stats_increments(self) -> dict[str, float]:
        now = dataclasses.asdict(self._collector.stats)
        out = {name: type(now[name])(now[name] - self._reported[name]) for name in _FORWARDED_STATS}
        self._reported = {name: now[name] for name in _FORWARDED_STATS}
        return out

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self._collector is not None:
            self._collector.close()
        if self._env is not None:
            self._env.close()
            self._env = None
