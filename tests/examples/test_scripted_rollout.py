"""examples/scripted_rollout.py runs as written (tiny settings) and measures the policy's accuracy."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_scripted_rollout_runs_offline():
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "scripted_rollout.py"), "--rounds", "3", "--accuracy", "1.0"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    assert out.count("round ") == 3
    assert re.search(r"measured accuracy 1\.000 over 48 episodes", out), out
