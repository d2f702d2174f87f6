"""Running totals of a collector (local or Ray), with rates and namespaced metrics for loggers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["CollectorStats"]


@dataclass
class CollectorStats:
    """Running totals of a :class:`~gym_llm_adapters.collector.Collector` (rates are over ``wall_s``, the time spent collecting).

    ``restarts``: env shards (local) or env workers (Ray) restarted after a failure; ``episodes_dropped``: in-flight
    episodes they lost; ``episodes_orphaned``: finished episodes dropped because the rest of their group was lost
    (see :mod:`gym_llm_adapters.faults`); ``reward_failed``: episodes released whose reward could not be computed (a
    judge, reward model or grader failure: ``Trajectory.reward_failed``), which the trainer leaves out of the loss;
    ``reward_stage_s``: time spent in reward stages (judges, reward models)."""

    batches: int = 0
    episodes: int = 0
    steps: int = 0
    env_steps: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    generate_s: float = 0.0
    env_s: float = 0.0
    wall_s: float = 0.0
    restarts: int = 0
    episodes_dropped: int = 0
    episodes_orphaned: int = 0
    reward_failed: int = 0
    reward_stage_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of collection."""
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self, prefix: str = "collector/") -> dict[str, float]:
        """Flat metrics with namespaced keys, for loggers."""
        out: dict[str, float] = {prefix + k: float(v) for k, v in dataclasses.asdict(self).items()}
        for name in ("tokens_per_s", "episodes_per_s", "steps_per_s"):
            out[prefix + name] = getattr(self, name)
        return out
