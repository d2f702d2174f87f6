"""The TRL examples' CPU modes run exactly as their docstrings say (every documented ``--tiny`` command).

Each command runs as a subprocess in a temporary working directory (so ``runs/`` lands there), with the checkout's
packages first on the path.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ("trl_grpo_gsm8k.py", "trl_sft_from_rollouts.py", "trl_grpo_arithmetic.py")
DISTRIBUTED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def documented_tiny_commands() -> list[list[str]]:
    commands = []
    for name in EXAMPLES:
        doc = ast.get_docstring(ast.parse((REPO / "examples" / name).read_text()))
        lines = [line.strip() for line in doc.splitlines() if line.strip().startswith(f"python examples/{name}")]
        tiny = [shlex.split(line) for line in lines if "--tiny" in line.split()]
        assert tiny, f"{name} documents no --tiny command"
        commands.extend(tiny)
    return commands


@pytest.mark.slow
@pytest.mark.parametrize("command", documented_tiny_commands(), ids=lambda c: " ".join(c[1:]))
def test_documented_cpu_command_runs(tmp_path, command):
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}  # a user's shell, not a worker's
    env.update(OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "adapters"), os.environ.get("PYTHONPATH", "")]))
    argv = [sys.executable, str(REPO / command[1]), *command[2:]]
    result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^done: 2 steps, losses finite: True$", result.stdout, re.MULTILINE), result.stdout
    if "--python-tool" in command:  # the episodes were written for the SFT example
        assert (tmp_path / "runs" / "trl_grpo_gsm8k" / "rollouts.jsonl").stat().st_size > 0
    if command[1].endswith("trl_grpo_arithmetic.py"):  # held-out before / after the warm start / after GRPO
        summary = json.loads((tmp_path / "runs" / "trl_grpo_arithmetic" / "heldout.json").read_text())
        assert summary["episodes"] == 20 and {"before", "after_sft", "after", "gain", "grpo_gain"} <= set(summary)
        assert [len(summary["rewards"][k]) for k in ("before", "after_sft", "after")] == [20, 20, 20]  # per problem
        assert re.search(r"^held-out pass rate: .* before -> .* after SFT -> .* after GRPO; paired gain", result.stdout,
                         re.MULTILINE), result.stdout
