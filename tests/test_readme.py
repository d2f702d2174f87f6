"""The README's two commands are what CI runs, its main job parses and learns, and its env table is complete."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests import background

REPO = Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_set_up_and_test_commands():
    """CI = the README's test command (set-up, then the plain run) and then its heavy tests' command (``-m slow``)."""
    readme = (REPO / "README.md").read_text()
    blocks = _bash_blocks(readme)
    test_command, slow_command = [b for b in blocks if "pytest" in b][:2]
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert " && ".join(ci_lines[:2]) == test_command == "bash scripts/setup.sh && .venv/bin/python -m pytest"
    assert ci_lines[2:] == [slow_command] == [".venv/bin/python -m pytest -m slow"]
    main_job = blocks[0]
    assert main_job.startswith("bash scripts/setup.sh && ")
    assert main_job.split("&& ", 1)[1].startswith(".venv/bin/gym-llm ")


def main_job_argv() -> list[str]:
    """The README's main job (SmolLM2 learning held-out sums): the ``gym-llm`` arguments after the set-up.
    tests/examples/test_smollm2_learns.py runs its first part."""
    blocks = _bash_blocks((REPO / "README.md").read_text())
    return shlex.split(blocks[0].split("&& ", 1)[1])[1:]


def smoke_path_argv() -> list[str]:
    """The README's fast smoke path (a tiny model from scratch): the ``gym-llm`` arguments of its command."""
    blocks = _bash_blocks((REPO / "README.md").read_text())
    block = next(b for b in blocks if "arithmetic_tiny.toml" in b and "setup.sh" not in b)
    return shlex.split(block)[1:]


def test_main_job_command_and_config_parse():
    from gym_llm_adapters.cli import parse_args
    from gym_llm_adapters.cli.train import config_from_args

    cwd = os.getcwd()
    os.chdir(REPO)  # the README's paths are relative to the checkout
    try:
        config = config_from_args(parse_args(main_job_argv()))
        smoke = config_from_args(parse_args(smoke_path_argv()))
    finally:
        os.chdir(cwd)
    assert config.algorithm == "grpo" and config.env_id == "LLMGSM8K-v0" and config.model == "smollm2"
    assert config.env_kwargs["source"] == "arithmetic" and config.sft_warmup_steps > 0
    assert config.env_kwargs["operand_pairs"] == "train" and config.eval_env_kwargs["operand_pairs"] == "test"
    assert smoke.algorithm == "grpo" and smoke.model == "tiny" and smoke.env_kwargs["source"] == "arithmetic"


# The floor the README states for the smoke path (its sentence is checked below): greedy eval reward on the 200
# problems at the end of the run and at every evaluation after the SFT warm-up, and the per-token KL to the
# reference averaged over the last 25 steps (a policy that drifted away from the warm start shows up there).
FINAL_FLOOR, AFTER_SFT_FLOOR, KL_CEILING = 0.95, 0.9, 0.1


def _smoke_path(out_dir: Path) -> tuple[list[str], dict[str, str], Path]:
    """The README's smoke path exactly as documented, with only --out and --no-progress added."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters"), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "gym_llm_adapters.cli", *smoke_path_argv(), "--out", str(out_dir / "run"),
            "--no-progress"]
    return argv, env, REPO


background.register("test_smoke_path_reaches_the_floor_the_readme_states", _smoke_path)


@pytest.mark.slow
def test_smoke_path_reaches_the_floor_the_readme_states():
    """All 250 steps of the documented run (started at collection, beside the rest of the suite: see
    tests/background.py)."""
    readme = (REPO / "README.md").read_text()
    assert (f"at least {FINAL_FLOOR:.2f} at the end, at least {AFTER_SFT_FLOOR:.2f} at every evaluation after the "
            f"warm-up, and a per-token KL to the reference below {KL_CEILING:.1f} over the last 25 steps") in \
        " ".join(readme.split())
    done = background.result("test_smoke_path_reaches_the_floor_the_readme_states", timeout_s=900)
    assert done.returncode == 0, done.stderr[-3000:]
    run = done.out_dir / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r["eval/reward_mean"] for r in rows if "eval/reward_mean" in r}
    warmup, total = 100, 250
    assert sorted(evals) == list(range(0, total + 1, 25)), evals
    assert evals[0] <= 0.05, evals  # a random-init model
    assert evals[total] >= FINAL_FLOOR and min(v for s, v in evals.items() if s >= warmup) >= AFTER_SFT_FLOOR, evals
    kl = [r["train/kl"] for r in rows if "train/kl" in r]
    assert len(kl) == total - warmup and np.mean(kl[-25:]) < KL_CEILING, kl[-25:]
    assert (run / "curves.png").is_file()


def test_readme_env_table_is_the_registrys():
    """The README's env table is what `gym-llm list --markdown` prints from the registry (regenerate it with that)."""
    from gym_llm.registration import markdown_table

    readme = (REPO / "README.md").read_text()
    table = markdown_table()
    assert table in readme, "README's env table is stale: paste the output of `gym-llm list --markdown`"
    printed = subprocess.run([sys.executable, "-m", "gym_llm_adapters.cli", "list", "--markdown"], capture_output=True,
                             text=True, check=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")])})
    assert printed.stdout.strip() == table


def test_python_snippets_are_valid_python():
    """Every ```python block of the README and docs/ parses (the env-level ones also run in the tests of each env)."""
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        blocks = re.findall(r"^( *)```python\n(.*?)^\1```", path.read_text(), flags=re.S | re.M)
        for number, (_, block) in enumerate(blocks):  # blocks inside list items are indented
            try:
                compile(textwrap.dedent(block), f"{path.name} python block {number}", "exec")
            except SyntaxError as e:
                raise AssertionError(f"{path.name}: python block {number} does not parse: {e}") from e
