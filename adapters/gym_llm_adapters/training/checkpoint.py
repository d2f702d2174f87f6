"""Atomic, resumable checkpoints of a training run.

Layout under ``out_dir/checkpoints/``::

    step-000040/            a normal Hugging Face checkpoint (config, safetensors, tokenizer) that vLLM and
                            transformers load as is, plus the trainer's state:
        trainer_state.json  step, phase, engine version, rows of rollouts/metrics written, the config
        optimizer.pt        optimizer + learning-rate scheduler state
        rng.pt              torch / numpy / Python RNG states
    reference/              the frozen reference policy (written once, when RL starts after an SFT warm-up)
    LATEST                  the name of the newest complete checkpoint

A checkpoint is written to ``step-N.tmp``, fsynced, and renamed into place; ``LATEST`` is replaced atomically
afterwards. A crash at any point leaves the previous checkpoint intact and ``LATEST`` naming a complete one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TrainState", "save_checkpoint", "latest_checkpoint", "load_trainer_state", "load_optimizer_state",
           "restore_rng", "checkpoints_dir"]

logger = logging.getLogger(__name__)

_STATE = "trainer_state.json"


@dataclass
class TrainState:
    """What a run needs besides weights to continue: counters and where its files end.

    Attributes:
        step: global steps done (SFT warm-up steps count too).
        phase: ``"sft"`` or ``"grpo"``: the phase of the *next* step.
        version: the engine's policy version (weight pushes so far).
        rollout_records: trajectories written to ``rollouts.jsonl`` so far.
        reference: the reference policy's folder (None: the starting model).
        config: the run's :meth:`TrainConfig.to_json`.
    """

    step: int
    phase: str
    version: int
    rollout_records: int
    reference: str | None
    config: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def checkpoints_dir(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / "checkpoints"


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(out_dir: str | os.PathLike, state: TrainState, *, model: Any, tokenizer: Any,
                    optimizer: Any, scheduler: Any, keep: int) -> Path:
    """Write ``step-<state.step>`` atomically, point ``LATEST`` at it, and prune all but the newest ``keep``."""
    import torch

    root = checkpoints_dir(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{state.step:06d}"
    final, tmp = root / name, root / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}, tmp / "rng.pt")
    (tmp / _STATE).write_text(json.dumps(state.to_json(), indent=1), encoding="utf-8")
    _fsync_tree(tmp)
    shutil.rmtree(final, ignore_errors=True)  # a re-run of the same step after a resume
    os.replace(tmp, final)
    latest_tmp = root / "LATEST.tmp"
    latest_tmp.write_text(name, encoding="utf-8")
    with open(latest_tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(latest_tmp, root / "LATEST")
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    for old in sorted(root.glob("step-[0-9]*"))[:-keep]:
        if old.suffix != ".tmp" and old != final:
            shutil.rmtree(old, ignore_errors=True)
    logger.info("checkpoint %s", final)
    return final


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder of a run, or None."""
    root = checkpoints_dir(out_dir)
    pointer = root / "LATEST"
    if pointer.is_file():
        candidate = root / pointer.read_text(encoding="utf-8").strip()
        if (candidate / _STATE).is_file():
            return candidate
    complete = [p for p in sorted(root.glob("step-[0-9]*")) if p.suffix != ".tmp" and (p / _STATE).is_file()]
    return complete[-1] if complete else None


def load_trainer_state(path: str | os.PathLike) -> TrainState:
    data = json.loads((Path(path) / _STATE).read_text(encoding="utf-8"))
    return TrainState(**data)


def load_optimizer_state(path: str | os.PathLike, optimizer: Any, scheduler: Any) -> None:
    import torch

    saved = torch.load(Path(path) / "optimizer.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])


def restore_rng(path: str | os.PathLike) -> None:
    import torch

    saved = torch.load(Path(path) / "rng.pt", map_location="cpu", weights_only=False)
    torch.set_rng_state(saved["torch"])
    np.random.set_state(saved["numpy"])
    random.setstate(saved["python"])
    if saved.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
