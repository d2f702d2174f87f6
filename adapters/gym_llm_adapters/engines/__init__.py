"""Inference engines behind one protocol: in-process vLLM, a running vLLM server, transformers.

Heavy backends are imported on first use, so ``from gym_llm_adapters.engines import HFEngine`` does not
import vLLM.
"""

from __future__ import annotations

from typing import Any

from gym_llm_adapters.engines.base import Engine, EngineBase, SamplingConfig, named_tensors

__all__ = ["Engine", "EngineBase", "SamplingConfig", "named_tensors", "HFEngine", "VLLMEngine",
           "VLLMServerEngine", "VLLMServer"]

_LAZY = {
    "HFEngine": "gym_llm_adapters.engines.hf",
    "VLLMEngine": "gym_llm_adapters.engines.vllm",
    "VLLMServerEngine": "gym_llm_adapters.engines.server",
    "VLLMServer": "gym_llm_adapters.engines.server_process",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
