"""A new user's journey through the README, top to bottom, in fresh processes: the Quickstart's code as written (with
the data paths it asks for filled in, and the placeholders a user would have — sampled completions, a tokenizer —
defined), then the ``gym-llm`` commands a newcomer runs first: ``list``, ``play``, ``eval`` and ``train`` with tiny
settings (the README's own main job and eval run in ``tests/test_readme.py``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import shared_data_dir

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

PRELUDE = """
import numpy as np
from gym_llm_adapters.models.tokenizers import tiny_tokenizer
tokenizer = tiny_tokenizer()
completions = ["She makes 9 * 2 = 18 dollars. #### 18"] * 8          # what an engine sampled for the 8 prompts
sampled_ids = tokenizer.encode("Hello there.") + [tokenizer.eos_token_id]
response = "no commas here"
row = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
token_id = 5
"""


def quickstart_blocks() -> list[str]:
    """The README's Quickstart, then docs/envs.md (the envs in code, which the Quickstart links to)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Quickstart"): text.index("\n## ", text.index("## Quickstart") + 5)]
    envs = (REPO / "docs" / "envs.md").read_text()
    return re.findall(r"```python\n(.*?)```", section, flags=re.S) + re.findall(r"```python\n(.*?)```", envs, flags=re.S)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")]), "OMP_NUM_THREADS": "1"}


def test_the_quickstart_runs_as_written(tmp_path):
    data = shared_data_dir()
    code = "\n".join(quickstart_blocks())
    code = code.replace("path/to/gsm8k/test.jsonl", str(data / "gsm8k" / "test.jsonl"))
    code = code.replace("path/to/ifeval/input_data.jsonl", str(data / "ifeval" / "input_data.jsonl"))
    code = code.replace('MCPTool("python", ["my_mcp_server.py"])',  # "python" on a user's PATH is their venv's
                        f'MCPTool({sys.executable!r}, {[str(REPO / "tests" / "tools" / "mcp_server.py")]!r})')
    assert "path/to/" not in code, "a Quickstart path this test does not know"
    script = PRELUDE + code + "\nprint('QUICKSTART DONE')\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0 and "QUICKSTART DONE" in done.stdout, done.stderr[-3000:]


def gym_llm(*argv: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gym_llm_adapters.cli", *argv], capture_output=True, text=True,
                          env=_env(), cwd=cwd, input=stdin, timeout=600)


def test_the_first_commands_a_newcomer_runs(tmp_path):
    listing = gym_llm("list", cwd=tmp_path)
    assert listing.returncode == 0 and "LLMGSM8K-v0" in listing.stdout and "commands: gym-llm" in listing.stdout
    # docs/cli.md: answer generated a + b problems yourself
    played = gym_llm("play", "LLMGSM8K-v0", "--source", "arithmetic", cwd=tmp_path, stdin="I think\n#### 7\n.\n")
    assert played.returncode == 0 and "reward" in played.stdout and "mean return" in played.stdout, played.stderr
    evaluated = gym_llm("eval", "LLMGSM8K-v0", "--model", "tiny", "--engine", "hf", "--source", "arithmetic", "--n",
                        "4", "--max-new-tokens", "8", "--no-progress", "--out", "runs/eval.jsonl", cwd=tmp_path)
    assert evaluated.returncode == 0 and "pass rate" in evaluated.stdout, evaluated.stderr[-2000:]
    assert (tmp_path / "runs" / "eval.jsonl").is_file() and (tmp_path / "runs" / "eval.rewards.png").is_file()
    trained = gym_llm("train", "grpo", "--config", str(REPO / "examples" / "configs" / "arithmetic_tiny.toml"),
                      "--engine", "hf", "--steps", "2", "--sft-warmup-steps", "2", "--eval-episodes", "8",
                      "--no-progress",
                      "--out", "runs/train", cwd=tmp_path)
    assert trained.returncode == 0 and "done after 4 steps" in trained.stdout, trained.stderr[-3000:]
    assert re.search(r"a GRPO step's time \(mean of this run\): [0-9.]+ s: rollout [0-9.]+ s \(\d+%; engine", trained.stdout)
    assert (tmp_path / "runs" / "train" / "curves.png").is_file()
    again = gym_llm("train", "grpo", "--config", str(REPO / "examples" / "configs" / "arithmetic_tiny.toml"),
                    "--out", "runs/train", cwd=tmp_path)  # the same --out again: refused, with the fix
    assert again.returncode == 2 and "--resume" in again.stderr and "Traceback" not in again.stderr
