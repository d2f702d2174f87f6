"""bench/lora.py runs at the tiny shape: both sides, every row, finite ratios, the JSON record. No timing is asserted
(a benchmark's numbers belong to its machine and its load; the script prints them)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROWS = ("reference log-probs (ms)", "policy fwd+bwd (GRPOLoss) (ms)", "optimizer (clip, AdamW) (ms)",
        "push to vLLM (ms)", "step (the four phases) (ms)", "push bytes (MiB)", "RSS after imports (MiB)",
        "+ model loaded (MiB)", "+ vLLM engine started (MiB)", "peak RSS (whole process) (MiB)",
        "peak RSS less the engine (MiB)", "training's own peak (MiB)")


@pytest.mark.slow  # two fresh processes, each starting vLLM: ~45 s
def test_the_lora_benchmark_runs_at_the_tiny_shape_and_writes_its_figures(tmp_path):
    record = tmp_path / "lora.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(REPO / "bench" / "lora.py"), "--model", "tiny", "--groups", "2",
                           "--group-size", "2", "--completion-tokens", "8", "--warmup", "0", "--steps", "1",
                           "--device", "cpu", "--json", str(record)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for line in ("command: OMP_NUM_THREADS=1 python bench/lora.py --model tiny", "machine: ", "commit: ", "date: ",
                 "same first-step loss", "the engine serves the trained weights"):
        assert line in out, out
    table = {line[:32].strip(): line[32:].split() for line in out.splitlines() if line[:32].rstrip().endswith("B)")
             or line[:32].rstrip().endswith("ms)")}  # label: full, LoRA, LoRA/full[, goal]
    assert list(table) == list(ROWS), out
    for label, (full, lora, ratio, *goal) in table.items():
        assert math.isfinite(float(ratio)) and float(full) >= 0 and float(lora) >= 0, (label, out)
    assert all(table[row][3:5] == ["<=", goal] for row, goal in (
        ("push to vLLM (ms)", "0.2x:"), ("push bytes (MiB)", "0.05x:"), ("peak RSS (whole process) (MiB)", "0.7x:"),
        ("peak RSS less the engine (MiB)", "0.7x:"))), out
    figures = json.loads(record.read_text())
    assert figures["bench"] == "lora" and figures["settings"]["rank"] == 16 and figures["settings"]["model"] == "tiny"
    assert set(figures["goals"]) == {"push_bytes", "push_s", "peak_mib", "peak_less_engine_mib"}
    for key, ratio in figures["ratios"].items():
        assert math.isfinite(ratio) and ratio > 0, (key, ratio)
    assert figures["full"]["push_bytes"] > figures["lora"]["push_bytes"] > 0
    for side in ("full", "lora"):
        assert figures[side]["peak_mib"] >= figures[side]["start_mib"] > 0
        assert figures["runs"][side]["engine_vs_trainer_max_abs"] < 1e-3
    # LoRA trains the adapter alone: rank 16 x (in + out) on each linear layer of the tiny model's 2 layers (q and o
    # 128 -> 128, k and v 128 -> 64, gate and up 128 -> 256, down 256 -> 128)
    per_layer = 16 * (2 * (128 + 128) + 2 * (128 + 64) + 3 * (128 + 256))
    assert figures["runs"]["lora"]["trainable_params"] == 2 * per_layer
    assert figures["runs"]["full"]["trainable_params"] == figures["runs"]["full"]["model_params"]
