"""Where a training step's time goes: a lap clock for one step, the run's means, and the line ``train`` prints."""

from __future__ import annotations

import time

__all__ = ["PhaseClock", "StepTimes", "format_step_time"]


class PhaseClock:
    """Seconds between successive :meth:`lap` calls, by phase name (``parts``; other entries may be added)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.parts[name] = self.parts.get(name, 0.0) + now - self._last
        self._last = now


class StepTimes:
    """The seconds of every step of a run, summed by phase; :meth:`means` per step."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}
        self.steps = 0

    def add(self, parts: dict[str, float]) -> None:
        for name, seconds in parts.items():
            self.total[name] = self.total.get(name, 0.0) + seconds
        self.steps += 1

    def means(self) -> dict[str, float]:
        """Mean seconds per step by phase; empty before the first step."""
        return {name: seconds / self.steps for name, seconds in self.total.items()} if self.steps else {}


def format_step_time(breakdown: dict[str, float]) -> str:
    """``"1.020 s: rollout 0.710 s (70%; engine 0.620 s, envs 0.050 s), reference 0.050 s (5%), ..."``: the top-level
    phases (``rollout_*`` entries are parts of ``rollout``) with their share of the step."""
    top = [name for name in breakdown if not name.startswith("rollout_")]
    total = sum(breakdown[name] for name in top)
    parts = []
    for name in top:
        share = f"{breakdown[name] / total:.0%}" if total else "-"
        if name == "rollout" and "rollout_generate" in breakdown:
            share += f"; engine {breakdown['rollout_generate']:.3f} s, envs {breakdown.get('rollout_env', 0.0):.3f} s"
        parts.append(f"{name} {breakdown[name]:.3f} s ({share})")
    return f"{total:.3f} s: " + ", ".join(parts)
