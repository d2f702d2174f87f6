"""scripts/gpu_checks.py, the GPU script, where there is no GPU: its LoRA check runs on the CPU (the same code a GPU
runs, on another device) and passes; a check that does not exist is refused. The precision and sampled-distribution
checks have CPU twins in tests/adapters/training/test_precision.py and tests/adapters/test_token_logprobs.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def gpu_checks():
    spec = importlib.util.spec_from_file_location("gpu_checks", REPO / "scripts" / "gpu_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_lora_check_runs_and_passes_on_the_cpu():
    checks = gpu_checks()
    result = checks.lora_check("cpu")
    assert "skipped" not in result, result
    assert result["base_unchanged"] and result["adapter_b_max_abs"] > 0 and result["engine_version"] == 1
    assert result["engine_vs_trainer_max_abs_err"] < 1e-5 < 1e-3 < result["engine_vs_base_max_abs_diff"]
    assert checks.lora_ok(result)
    assert not checks.lora_ok({**result, "engine_vs_trainer_max_abs_err": 0.1})  # a stale engine fails the check
    assert not checks.lora_ok({**result, "base_unchanged": False})


def test_an_unknown_check_is_refused():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_checks.py"), "--checks", "lora,nope"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown ['nope']" in done.stderr, done.stderr
