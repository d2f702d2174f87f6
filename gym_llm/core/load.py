"""Waits that scale with the machine's load, for the clocks that are not the point.

A readiness wait (a sandbox starting, an interpreter loading a runtime) or the wall-clock backstop of a CPU-time limit
bounds how long *something that is making progress* may take; on a machine whose cores are all taken, that progress
is slower by about the ratio of runnable tasks to cores. :func:`load_scaled` stretches such a wait by that ratio
(never below the given time, at most :data:`MAX_SCALE` times it). A wait whose wall-clock time *is* the point — a
user's per-call timeout, an episode budget — must not use it.

>>> load_scaled(10.0, load=1.0, cpus=2)
10.0
>>> load_scaled(10.0, load=6.0, cpus=2)
30.0
>>> load_scaled(10.0, load=100.0, cpus=2)
80.0
"""

from __future__ import annotations

import os

__all__ = ["MAX_SCALE", "load_scaled"]

MAX_SCALE = 8.0
"""The most a wait is stretched: a machine this overloaded is reported, not waited on forever."""


def load_scaled(seconds: float, *, load: float | None = None, cpus: int | None = None) -> float:
    """``seconds`` times ``max(1, min(MAX_SCALE, load / cpus))``: the one-minute load average over this process's
    usable CPUs (``load`` and ``cpus`` override them, for tests). Where the load cannot be read, ``seconds``."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            return float(seconds)
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return float(seconds) * max(1.0, min(MAX_SCALE, load / max(1, cpus)))
