"""scripts/ci_matrix.sh runs pytest once per forced CPU path and reports each; a failing path fails the script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run_matrix(paths: str, *pytest_args: str, log_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATHS": paths, "LOG_DIR": str(log_dir)}
    return subprocess.run(["bash", str(REPO / "scripts" / "ci_matrix.sh"), *pytest_args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def test_each_path_runs_the_given_tests_under_its_switches(tmp_path):
    probe = tmp_path / "test_probe.py"  # records what each run saw
    probe.write_text(
        "import os\n"
        "def test_switches():\n"
        "    with open(os.environ['PROBE_OUT'], 'a') as f:\n"
        "        f.write(' '.join(os.environ.get(k, '-') for k in ('GYM_LLM_CPU_ISA', 'GYM_LLM_VLLM_GEMM',\n"
        "                'ATEN_CPU_CAPABILITY', 'ONEDNN_MAX_CPU_ISA')) + '\\n')\n")
    os.environ["PROBE_OUT"] = str(tmp_path / "seen.txt")
    try:
        result = run_matrix("native gemm=torch isa=avx2", str(probe), "-q", log_dir=tmp_path)
    finally:
        del os.environ["PROBE_OUT"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert (tmp_path / "seen.txt").read_text().splitlines() == [
        "native auto - -", "native torch - -", "avx2 auto avx2 AVX2"]
    table = result.stdout.split("ci_matrix on: ", 1)[1].splitlines()
    assert [line.split()[:2] for line in table[1:4]] == [["native", "rc=0"], ["gemm=torch", "rc=0"],
                                                         ["isa=avx2", "rc=0"]]


def test_a_failing_path_fails_the_script_and_a_bad_path_is_refused(tmp_path):
    failing = tmp_path / "test_fails.py"
    failing.write_text("import os\ndef test_only_native():\n    assert os.environ['GYM_LLM_VLLM_GEMM'] == 'auto'\n")
    result = run_matrix("native gemm=torch", str(failing), "-q", log_dir=tmp_path)
    assert result.returncode == 1 and ["gemm=torch", "rc=1"] in [line.split()[:2] for line in result.stdout.splitlines()]
    result = run_matrix("fast", str(failing), log_dir=tmp_path)
    assert result.returncode == 2 and "unknown path 'fast'" in result.stderr
