"""The TRL examples' CPU modes run exactly as their docstrings say (every documented ``--tiny`` command).

Each command runs as ``python examples/NAME.py ...`` would, in a temporary working directory (so ``runs/`` lands
there), in the test's process (tests/examples/documented.py says why: a new interpreter would spend ~10 of a
command's ~13 CPU-seconds importing TRL).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

from tests.examples.documented import run_example

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ("trl_grpo_gsm8k.py", "trl_sft_from_rollouts.py", "trl_grpo_arithmetic.py")


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
    stdout = run_example(command, tmp_path)
    assert re.search(r"^done: 2 steps, losses finite: True$", stdout, re.MULTILINE), stdout
    if "--python-tool" in command:  # the episodes were written for the SFT example
        assert (tmp_path / "runs" / "trl_grpo_gsm8k" / "rollouts.jsonl").stat().st_size > 0
    if command[1].endswith("trl_grpo_arithmetic.py"):  # held-out before / after the warm start / after GRPO
        summary = json.loads((tmp_path / "runs" / "trl_grpo_arithmetic" / "heldout.json").read_text())
        assert summary["episodes"] == 20 and {"before", "after_sft", "after", "gain", "grpo_gain"} <= set(summary)
        assert [len(summary["rewards"][k]) for k in ("before", "after_sft", "after")] == [20, 20, 20]  # per problem
        assert re.search(r"^held-out pass rate: .* before -> .* after SFT -> .* after GRPO; paired gain", stdout,
                         re.MULTILINE), stdout
