"""Shared fixtures: real data, real tokenizers (built offline), tiny settings."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Every test process and what it starts (engines, servers, CLI runs) computes on one thread, unpinned: the suite runs
# on pytest-xdist workers, and vLLM-CPU's default ("auto") pins OpenMP threads to every core, so two workers' engines
# spun on the same cores (a 9 s engine start took 107 s). Tests that measure threads set their own.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

# The suite starts ~100 Python processes (CLI runs, examples, servers, sandboxes) that import this checkout. Where
# PYTHONDONTWRITEBYTECODE is set (as on this project's machines), each of them would compile the same modules again and
# pytest would re-rewrite every test module's asserts in each worker: the suite caches bytecode (in __pycache__, which
# git ignores) whatever the variable says. Measured: 607 s -> 589 s for the whole suite on the 2-core Xeon.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

# Hypothesis fails an example that takes over 200 ms by default: a timing assertion, which a loaded machine trips
# (a chat-template property test failed so beside a sandbox-heavy run). Timings never go in unit tests: no deadline.
try:
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("gym_llm", deadline=None)
    _hypothesis_settings.load_profile("gym_llm")
except ImportError:  # hypothesis is in [dev]; a plain install runs the tests that do not use it
    pass


def shared_data_dir() -> Path:
    """The project's shared data folder: $GYM_LLM_DATA, ../shared/data beside the checkout, or /work/shared/data."""
    candidates = [os.environ.get("GYM_LLM_DATA"), REPO.parent / "shared" / "data", Path("/work/shared/data")]
    for candidate in candidates:
        if candidate and (Path(candidate) / "gsm8k" / "test.jsonl").is_file():
            return Path(candidate)
    raise RuntimeError(
        "The real GSM8K/IFEval data was not found; set GYM_LLM_DATA to the folder holding gsm8k/ and ifeval/ "
        f"(looked in: {[str(c) for c in candidates if c]})."
    )


def shared_mlgym_dir() -> Path:
    """The five MLGym fixture tasks (a checkout's configs/ and data/): $GYM_LLM_MLGYM, ../shared/mlgym beside the
    checkout, or /work/shared/mlgym."""
    candidates = [os.environ.get("GYM_LLM_MLGYM"), REPO.parent / "shared" / "mlgym", Path("/work/shared/mlgym")]
    for candidate in candidates:
        if candidate and (Path(candidate) / "configs" / "tasks").is_dir():
            return Path(candidate)
    raise RuntimeError(
        "The MLGym fixture tasks were not found; set GYM_LLM_MLGYM to the folder holding configs/tasks and data/ "
        f"(looked in: {[str(c) for c in candidates if c]})."
    )


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return shared_data_dir()


@pytest.fixture(scope="session")
def gsm8k_test_file(data_dir: Path) -> Path:
    return data_dir / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="session")
def gsm8k_train_file(data_dir: Path) -> Path:
    return data_dir / "gsm8k" / "train.jsonl"


@pytest.fixture(scope="session")
def ifeval_file(data_dir: Path) -> Path:
    return data_dir / "ifeval" / "input_data.jsonl"


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """Qwen2.5's real tokenizer (pad == eos == <|im_end|>)."""
    from gym_llm_adapters.models.tokenizers import qwen2_tokenizer

    return qwen2_tokenizer()


@pytest.fixture(scope="session")
def tiny_tok():
    """A 512-id byte-level BPE with ChatML specials (pad == eos)."""
    from gym_llm_adapters.models.tokenizers import tiny_tokenizer

    return tiny_tokenizer()


def pytest_configure(config):
    """Under pytest-xdist the controller fixes the run's id, so it and every worker find the background jobs'
    shared folder (tests/background.py); workers tag their grouped tests (:func:`_tag_xdist_groups`)."""
    from tests import schedule

    if hasattr(config, "workerinput"):
        config.pluginmanager.register(_GroupTagger(), "gym-llm-xdist-group-tagger")
    elif getattr(config.option, "numprocesses", None):
        config.option.loadscopereorder = False  # the workers send their units longest first (tests/schedule.py)
    if os.environ.get(schedule.RECORD_ENV) and (hasattr(config, "workerinput")
                                                or not getattr(config.option, "numprocesses", None)):
        config.pluginmanager.register(schedule.DurationRecorder(os.environ[schedule.RECORD_ENV]),
                                      "gym-llm-duration-recorder")
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        import uuid

        if getattr(config.option, "testrunuid", None) is None:
            config.option.testrunuid = uuid.uuid4().hex
        os.environ["PYTEST_XDIST_TESTRUNUID"] = config.option.testrunuid


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the default, pyproject.toml): one worker per CPU this process may run on, at most 4 — each
    worker may hold a model, engines and a Ray cluster's driver — and at least 1. Tests run single-threaded
    (``OMP_NUM_THREADS=1``), so workers do not oversubscribe the CPUs."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (its hook is untagged)
def pytest_collection_modifyitems(session, config, items):
    # Under pytest-xdist (--dist loadgroup) a group's tests run in one worker, so what they share is built once:
    # - "vllm": every test of the in-process vLLM engine session fixture (~30 s of CPU per build);
    # - a module whose tests share a module-scoped fixture (a `vllm serve`, a browser, a sandbox pool) is one group,
    #   or joins "vllm" when some of its tests use the session engine too. Spread over two workers, each would build
    #   the fixture (a `vllm serve` start is a minute). Tests already in a group (Ray's) keep theirs.
    def grouped(item) -> bool:
        return any(item.iter_markers("xdist_group"))

    def module_scoped(item) -> bool:
        info = getattr(item, "_fixtureinfo", None)
        return info is not None and any(defs and defs[-1].scope == "module"
                                        for defs in info.name2fixturedefs.values())

    vllm_modules = {item.nodeid.split("::")[0] for item in items
                    if "_vllm_session_engine" in getattr(item, "fixturenames", ())}
    for item in items:
        if grouped(item):
            continue
        module = item.nodeid.split("::")[0]
        if "_vllm_session_engine" in getattr(item, "fixturenames", ()) or (
                module in vllm_modules and module_scoped(item)):
            item.add_marker(pytest.mark.xdist_group("vllm"))
        elif module_scoped(item):
            item.add_marker(pytest.mark.xdist_group(module))


def pytest_collection_finish(session):
    """Long subprocesses of the selected tests start now, beside the suite (tests/background.py). Not in
    ``pytest_collection_modifyitems``: that runs before ``-k``/``-m`` deselect, which would start the jobs of tests
    that never run (and a job that re-runs its own module with ``-k "not <itself>"`` would start itself again)."""
    from tests import background

    background.start_selected(session.items)


class _GroupTagger:
    @pytest.hookimpl(trylast=True)  # after pytest-xdist's own tagging
    def pytest_collection_modifyitems(self, config, items):
        _tag_xdist_groups(config, items)
        if getattr(config.option, "loadgroup", False):
            from tests import schedule

            items[:] = schedule.longest_first(items)


def _tag_xdist_groups(config, items):
    """pytest-xdist's ``--dist loadgroup`` sends a group's tests to one worker by appending ``@group`` to their node
    ids on the worker (``item._nodeid = ...``). pytest 9.2 keeps node ids elsewhere (``item._id``, a ``NodeId``), so
    with pytest-xdist 3.8 the suffix silently went nowhere and every group was spread over the workers (each worker
    built its own `vllm serve`, Ray cluster, browser). This tags the ids where this pytest keeps them, once."""
    if not getattr(config.option, "loadgroup", False):  # set on the workers of a --dist loadgroup run
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if not names:
            continue
        suffix = "@" + "_".join(names)
        if item.nodeid.endswith(suffix):  # pytest-xdist's tagging took (pytest < 9.2)
            continue
        nodeid = item.nodeid + suffix
        if hasattr(item, "_id"):
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(nodeid)
        else:
            item._nodeid = nodeid
        if item.nodeid != nodeid:
            raise RuntimeError(f"could not tag {item.nodeid!r} with its pytest-xdist group {suffix!r}; "
                               "this pytest keeps node ids where tests/conftest.py does not look")


def pytest_sessionfinish(session, exitstatus):
    from tests import background

    worker = hasattr(session.config, "workerinput")  # a pytest-xdist worker: the controller removes the outputs
    background.stop_all(remove=not worker)
