"""A real local Ray cluster for the Ray adapter tests (one per session), and a shared transformers engine actor."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def ray_cluster():
    """A new local cluster (``address="local"``: never a cluster someone started on this machine), 2 CPUs; the
    actors import this checkout (PYTHONPATH), not an installed copy."""
    import ray

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "adapters")] + ([saved] if saved else []))
    try:  # the raylet and every worker process inherit this environment (OMP_NUM_THREADS=1 included)
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 object_store_memory=256 << 20)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved

    def package_file() -> str:  # a local function: pickled by value
        import gym_llm_adapters

        return gym_llm_adapters.__file__

    where = ray.get(ray.remote(package_file).remote())
    assert Path(where).is_relative_to(ROOT), f"Ray workers import {where}, not this checkout ({ROOT})"
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def hf_engines(ray_cluster, tiny_model_path):
    """One transformers engine actor on the tiny checkpoint, shared by the tests that never change its weights."""
    from gym_llm_adapters.ray import EngineGroup, EngineSpec

    group = EngineGroup(EngineSpec("hf", tiny_model_path))
    yield group
    group.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop the cluster right after the last test that uses it (the Ray tests are one pytest-xdist group, so they
    run back to back): its daemons and idle workers would otherwise take CPU from the rest of the suite until the
    session ends. "Last" is when every selected test that uses it has run (they are all in this process), not "the
    next test does not use it": the group also holds tests that need no cluster, and stopping before one of them
    meant a second cluster start (~10 CPU-s) after it. A later test asking for ``ray_cluster`` gets a new one."""
    yield
    if "ray_cluster" in item.fixturenames:
        _CLUSTER_USERS_RUN.add(item.nodeid)
        users = {i.nodeid for i in item.session.items if "ray_cluster" in getattr(i, "fixturenames", ())}
        if not users <= _CLUSTER_USERS_RUN:
            return
        for fixturedef in item._fixtureinfo.name2fixturedefs.get("ray_cluster", ()):
            fixturedef.finish(item._request)  # also finishes the fixtures built on it (hf_engines, ...)


_CLUSTER_USERS_RUN: set[str] = set()
