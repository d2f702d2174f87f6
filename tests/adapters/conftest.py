"""Fixtures for the adapters' tests: the tiny checkpoint, a transformers engine and one in-process vLLM engine.

The vLLM engine is session-scoped (building one costs seconds); tests that change its weights put the
original weights back (see ``vllm_engine``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest  # noqa: E402

from gym_llm_adapters.engines import cpu_paths  # noqa: E402

# A forced CPU path (scripts/ci_matrix.sh) must be in place before anything imports vLLM. Not the sampler helper: that
# imports vLLM (~5 CPU-s per pytest-xdist worker at collection); engines apply it when they load vLLM.
cpu_paths.apply(sampler=False)


@pytest.fixture(scope="session")
def tiny_model_path():
    from gym_llm_adapters.models.tiny import tiny_model_dir

    return tiny_model_dir()


@pytest.fixture(scope="session")
def hf_engine(tiny_model_path):
    """A transformers engine on the tiny checkpoint (float32, CPU). Tests that load weights restore them."""
    from gym_llm_adapters.engines import HFEngine

    return HFEngine(tiny_model_path)


@pytest.fixture(scope="session")
def _vllm_session_engine(tiny_model_path):
    """One in-process vLLM engine for the "vllm" group's tests (tests/conftest.py), built by the first that asks.
    Tests may build more in-process engines beside it (VLLMEngine keeps vLLM's per-process distributed state until
    the last engine core shuts down; tests/adapters/engines/test_vllm.py checks it)."""
    from gym_llm_adapters.engines import VLLMEngine

    engine = VLLMEngine(tiny_model_path, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20)
    yield engine
    engine.close()


@pytest.fixture
def vllm_engine(_vllm_session_engine, tiny_model_path):
    """The session's in-process vLLM engine, with the checkpoint's weights restored after the test."""
    version = _vllm_session_engine.version
    yield _vllm_session_engine
    if _vllm_session_engine.version != version or _vllm_session_engine._weights_broken is not None:
        _vllm_session_engine.load_weights(original_weights(tiny_model_path))


def original_weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.fixture
def fresh_hf_engine(tiny_model_path):
    """A transformers engine of its own, for tests that change weights."""
    from gym_llm_adapters.engines import HFEngine

    return HFEngine(tiny_model_path)
