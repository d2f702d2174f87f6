"""Quiet by default: the main job's terminal shows gym-llm's progress, evaluations and summary, and no dependency
noise (vLLM's CPU advice, Triton's absence, deprecations), which goes to the run's log file; ``-v`` shows it.
A hub model id fails in seconds when the hub cannot be reached, with the fix in the message."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from tests.test_readme import smoke_path_argv

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE_HUB = "http://127.0.0.1:9"  # the discard port: refused at once

# A line of dependency noise as it reached the terminal before (vLLM's "(MainProcess pid=1) WARNING ...", torch's
# "W1129 ...]" and "[W1129 ... utils.cpp:68] Warning: NUMA binding", "FutureWarning: ... is deprecated", a "warn("
# source line, an INFO line from vllm, a traceback).
NOISE = re.compile(r"warn|Triton|LD_PRELOAD|deprecat|Traceback|^\(\w+ pid=\d+\)|^\[?[WIE]\d{4} |INFO vllm|"
                   r"site-packages|torch\.set_num_threads|NUMA", re.IGNORECASE)


def noise_lines(output: str) -> list[str]:
    lines = [part for line in output.splitlines() for part in line.split("\r")]  # progress bars redraw with \r
    return [line for line in lines if NOISE.search(line)]


# settings an earlier test of the same process may have left in os.environ: the runs here test the defaults
_LOGGING_ENVIRONMENT = ("VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING", "TORCH_CPP_LOG_LEVEL")


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in _LOGGING_ENVIRONMENT}
    return {**base, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")]), "OMP_NUM_THREADS": "1",
            **extra}


def _smoke_path(out: Path, *flags: str) -> subprocess.CompletedProcess:
    """The README's fast smoke path (the tiny model, vLLM generating) cut to 2 SFT and 2 GRPO steps."""
    argv = [*flags, *smoke_path_argv(), "--steps", "2", "--sft-warmup-steps", "2", "--eval-episodes", "8",
            "--out", str(out)]
    return subprocess.run([sys.executable, "-m", "gym_llm_adapters.cli", *argv], capture_output=True, text=True,
                          env=_env(), cwd=REPO, timeout=600)


@pytest.mark.slow
def test_the_smoke_path_shows_no_dependency_noise(tmp_path):
    done = _smoke_path(tmp_path / "run")
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal[-3000:]
    assert noise_lines(terminal) == [], "\n".join(noise_lines(terminal))
    assert "eval at step 0: mean reward" in done.stdout and "done after 4 steps" in done.stdout
    assert "train:" in done.stderr  # the progress bar
    log = (tmp_path / "run" / "train.log").read_text()
    assert f"go to {tmp_path / 'run' / 'train.log'}" in done.stderr  # said once where the rest went
    assert "Triton" in log and "LD_PRELOAD" in log and "vllm" in log  # vLLM's CPU advice, kept in the log


@pytest.mark.slow
def test_verbose_shows_the_dependencies_messages(tmp_path):
    done = _smoke_path(tmp_path / "run", "-v")
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal[-3000:]
    assert "Triton" in terminal and "LD_PRELOAD" in terminal, terminal[-3000:]
    assert not (tmp_path / "run" / "train.log").exists()


def test_dependency_warnings_go_to_the_log_and_ours_stay(tmp_path, capsys):
    """In one process: a dependency's logger and Python warnings go to the file; gym-llm's warning does not; all
    is as before once the block ends."""
    from gym_llm_adapters.cli._output import log_to, quiet_dependencies

    dependency = logging.getLogger("vllm.worker")
    before = (logging.getLogger("vllm").handlers[:], logging.getLogger("vllm").propagate, warnings.showwarning)
    level = dependency.level  # its own level, not the parent's: vLLM, imported earlier in this worker, may have set
    dependency.setLevel(logging.WARNING)  # the "vllm" logger's level from VLLM_LOGGING_LEVEL
    try:
        _route_and_check(tmp_path, capsys, dependency, before)
    finally:
        dependency.setLevel(level)


def _route_and_check(tmp_path, capsys, dependency, before) -> None:
    from gym_llm_adapters.cli._output import log_to, quiet_dependencies

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with quiet_dependencies(verbose=False):
            dependency.warning("libtcmalloc is not found in LD_PRELOAD")  # held until the file is named
            path = log_to(tmp_path / "train.log", command="train")
            warnings.warn_explicit("`reduce_op` is deprecated", FutureWarning, "/venv/lib/site-packages/vllm/x.py", 1)
            warnings.warn_explicit("a gym-llm warning", UserWarning, "/venv/lib/site-packages/gym_llm/y.py", 2)
            dependency.error("the engine died")
    assert path == tmp_path / "train.log"
    log = path.read_text()
    assert "LD_PRELOAD" in log and "reduce_op" in log and "the engine died" in log and "gym-llm warning" not in log
    assert [str(w.message) for w in shown] == ["a gym-llm warning"]  # ours printed as usual (pytest records it)
    err = capsys.readouterr().err
    assert "LD_PRELOAD" not in err and "reduce_op" not in err and "the engine died" in err  # errors still show
    assert (logging.getLogger("vllm").handlers, logging.getLogger("vllm").propagate, warnings.showwarning) == before


def test_a_hub_model_fails_in_seconds_when_the_hub_cannot_be_reached(tmp_path):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gym_llm_adapters.cli", "eval", "LLMGSM8K-v0", "--model",
                           "someorg/some-model", "--source", "arithmetic"], capture_output=True, text=True, cwd=tmp_path,
                          env={**_env(HF_ENDPOINT=UNREACHABLE_HUB, HF_HOME=str(tmp_path / "hf")), "HF_HUB_OFFLINE": "0"},
                          timeout=120)
    elapsed = time.monotonic() - started
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "cannot be reached" in done.stderr and "local hub cache" in done.stderr
    assert "--model DIR" in done.stderr and "tiny, tiny-qwen2, smollm2" in done.stderr  # the fixes
    assert elapsed < 20, f"{elapsed:.0f} s (the hub client's retries took ~60 s)"


def test_a_cached_hub_model_is_read_offline(tmp_path, monkeypatch):
    """The hub does not answer but the model is in the local hub cache: offline mode is switched on, no error."""
    import huggingface_hub.constants

    from gym_llm_adapters.models.resolve import resolve_model

    snapshot = tmp_path / "hub" / "models--someorg--cached" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--someorg--cached" / "refs").mkdir()
    (tmp_path / "hub" / "models--someorg--cached" / "refs" / "main").write_text("abc")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE_HUB)
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(flag, raising=False)
    assert resolve_model("someorg/cached") == "someorg/cached"
    assert os.environ["HF_HUB_OFFLINE"] == "1" and huggingface_hub.constants.HF_HUB_OFFLINE is True
    with pytest.raises(ValueError, match="not in the local hub cache"):
        resolve_model("someorg/not-cached")
