"""`gym-llm train --report-to tensorboard trackio wandb`: a real tiny run's metrics, read back from each tracker's
own storage (trackio's local database through its API, W&B's offline run file, TensorBoard's event files)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gym_llm_adapters.training import reporters

pytestmark = pytest.mark.slow


def wandb_history(run_file: Path) -> list[dict[str, object]]:
    """The history rows of a W&B run file (a LevelDB-style log of protobuf ``Record``s after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, pending, rows = run_file.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a record header is padding
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # FULL/FIRST start a record, MIDDLE/LAST continue it
        if kind in (1, 4) and pending:
            record = pb.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
            pending = b""
    return rows


def test_a_run_reports_to_trackio_wandb_and_tensorboard(tmp_path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "TRACKIO_PROJECT": "gym-llm-test",
           "WANDB_MODE": "offline", "WANDB_PROJECT": "gym-llm-test", "WANDB_SILENT": "true"}
    cmd = [sys.executable, "-m", "gym_llm_adapters.cli", "train", "grpo", "--env", "LLMGSM8K-v0", "--model", "tiny",
           "--engine", "hf", "--source", "arithmetic", "--env-arg", "max_operand=9", "--steps", "3",
           "--num-tasks", "2", "--group-size", "2", "--max-new-tokens", "8", "--eval-every", "0", "--eval-episodes",
           "4", "--no-progress", "--out", str(out), "--report-to", "tensorboard", "trackio", "wandb"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["train/loss"] for r in rows if r.get("train/loss") is not None}
    assert sorted(losses) == [1, 2, 3]

    read = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
            "print(json.dumps(SQLiteStorage.get_logs('gym-llm-test', 'run')))")
    logs = json.loads(subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True,
                                     check=True, timeout=120).stdout)
    tracked = {row["step"]: row["train/loss"] for row in logs if "train/loss" in row}
    assert tracked == pytest.approx(losses)
    assert any("eval/pass_rate" in row for row in logs)

    (run_file,) = out.glob("wandb/offline-run-*/run-*.wandb")
    history = wandb_history(run_file)
    assert {row["_step"]: row["train/loss"] for row in history if "train/loss" in row} == pytest.approx(losses)
    assert (out / "wandb_run_id").read_text().strip() in run_file.name  # --resume continues this W&B run

    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


def test_unknown_or_missing_reporters_fail_before_any_model_loads(monkeypatch, tmp_path) -> None:
    from gym_llm_adapters.training import TrainConfig

    with pytest.raises(ValueError, match="unknown 'mlflow'; expected any of tensorboard, trackio, wandb"):
        TrainConfig(algorithm="grpo", model="tiny", env_id="LLMGSM8K-v0", out_dir=tmp_path, report_to=("mlflow",))
    monkeypatch.setitem(reporters.REPORTERS, "wandb", ("no_such_module_for_this_test", "pip install wandb"))
    with pytest.raises(ImportError, match="needs the no_such_module_for_this_test package.*pip install wandb"):
        TrainConfig(algorithm="grpo", model="tiny", env_id="LLMGSM8K-v0", out_dir=tmp_path, report_to=("wandb",))
