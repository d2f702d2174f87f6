"""Shared fixtures: real data, real tokenizers (built offline), tiny settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Every test process and what it starts (engines, servers, CLI runs) computes on one thread, unpinned: the suite runs
# on pytest-xdist workers, and vLLM-CPU's default ("auto") pins OpenMP threads to every core, so two workers' engines
# spun on the same cores (a 9 s engine start took 107 s). Tests that measure threads set their own.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


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
    shared folder (tests/background.py)."""
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
    # One in-process vLLM engine per worker is a session fixture of ~30 s of CPU: under pytest-xdist, the tests that
    # use it run in one worker ("vllm"), so it is built once. Tests already in a group (Ray's) keep theirs.
    for item in items:
        if "_vllm_session_engine" in getattr(item, "fixturenames", ()) and not any(item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group("vllm"))
    from tests import background

    background.start_selected(items)  # long subprocesses of selected tests run beside the suite (tests/background.py)


def pytest_sessionfinish(session, exitstatus):
    from tests import background

    worker = hasattr(session.config, "workerinput")  # a pytest-xdist worker: the controller removes the outputs
    background.stop_all(remove=not worker)
