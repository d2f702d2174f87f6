"""Scale-out on Ray: env workers, engines and the reference model as Ray actors (``pip install 'gym-llm[ray]'``).

``import gym_llm_adapters.ray`` does not import Ray; the classes import it when used. See ``docs/ray.md``.
"""

from __future__ import annotations

from typing import Any

from gym_llm_adapters.ray.specs import (EngineCallError, EngineDiedError, EngineSpec, EngineUnavailableError, EnvSpec,
                                        EnvWorkerDiedError)

__all__ = ["EnvSpec", "EngineSpec", "EngineGroup", "RemoteEngine", "RayCollector", "RayCollectorStats",
           "RemoteReferenceKL", "PackedWeights", "EngineUnavailableError", "EngineCallError", "EngineDiedError",
           "EnvWorkerDiedError"]

_LAZY = {
    "EngineGroup": "gym_llm_adapters.ray.engines",
    "RemoteEngine": "gym_llm_adapters.ray.engines",
    "RayCollector": "gym_llm_adapters.ray.collector",
    "RayCollectorStats": "gym_llm_adapters.ray.collector",
    "RemoteReferenceKL": "gym_llm_adapters.ray.kl",
    "PackedWeights": "gym_llm_adapters.ray.weights",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
