"""Atomic, resumable checkpoints of a training run.

Layout under ``out_dir/checkpoints/``::

    step-000040/            a normal Hugging Face checkpoint (config, safetensors, tokenizer) that vLLM and
                            transformers load as is — or, for a LoRA run, the adapter in PEFT's format
                            (adapter_model.safetensors, adapter_config.json) and the tokenizer — plus the
                            trainer's state:
        trainer_state.json  step, phase, engine version, rows of rollouts/metrics written, the config (and a
                            LoRA run's adapter settings and base model)
        optimizer.pt        optimizer + learning-rate scheduler state (tensors and plain values; a LoRA run's
                            optimizer holds the adapter's parameters only)
        rng.pt              torch / numpy / Python RNG states (tensors and plain values)
    reference/              the frozen reference policy (written once, when RL starts after an SFT warm-up; a LoRA
                            run's is the adapter at that point, in PEFT's format)
    LATEST                  the name of the newest complete checkpoint

A checkpoint is written to ``step-N.tmp``, fsynced, and renamed into place; ``LATEST`` is replaced atomically
afterwards. A crash at any point leaves the previous checkpoint intact and ``LATEST`` naming a complete one.

**Reading a run folder runs nothing from it.** A run folder may come from elsewhere (or a ``--config`` may point
``out`` at one), so the state files are read with ``torch.load(..., weights_only=True)``: tensors, numbers, strings
and containers only, never an object that unpickles by calling code. A file that holds anything else is refused
(:class:`CheckpointError`) before a model is loaded. Folders written before the RNG state was stored as tensors hold
numpy's state as a ``uint32`` array; those are read with exactly numpy's array and ``uint32`` dtype allowed as well.
The weights are safetensors and the tokenizer plain files, loaded without remote code.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CheckpointError", "SavedState", "TrainState", "checkpoints_dir", "latest_checkpoint",
           "load_trainer_state", "read_saved_state", "restore_rng", "save_checkpoint"]

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
        reference: the reference policy's folder (None: the starting model; for a LoRA run, the base with the
            adapter off).
        config: the run's :meth:`TrainConfig.to_json`.
        lora: a LoRA run's adapter settings and base model
            (:func:`~gym_llm_adapters.training.lora_run.lora_record`); None for a full fine-tune.
    """

    step: int
    phase: str
    version: int
    rollout_records: int
    reference: str | None
    config: dict[str, Any]
    lora: dict[str, Any] | None = None

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
                    optimizer: Any, scheduler: Any, keep: int, model_state: dict | None = None,
                    optimizer_state: dict | None = None) -> Path:
    """Write ``step-<state.step>`` atomically, point ``LATEST`` at it, and prune all but the newest ``keep``.

    ``model`` is a transformers model (saved whole) or a PEFT model (its trained adapter saved, in PEFT's format).
    ``model_state`` / ``optimizer_state``: whole tensors to write instead of the model's and optimizer's own state
    dicts (an FSDP2 run's, gathered from the shards: training/fsdp.py).
    """
    import torch

    root = checkpoints_dir(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{state.step:06d}"
    final, tmp = root / name, root / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if _is_peft(model):
        from gym_llm_adapters.lora import save_adapter

        save_adapter(model, tmp)
    elif model_state is not None:
        model.save_pretrained(tmp, state_dict=model_state, safe_serialization=True)
    else:
        model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save({"optimizer": optimizer_state if optimizer_state is not None else optimizer.state_dict(),
                "scheduler": scheduler.state_dict()}, tmp / "optimizer.pt")
    torch.save(_rng_state(), tmp / "rng.pt")
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


def _is_peft(model: Any) -> bool:
    peft = sys.modules.get("peft")  # a PEFT model exists only once peft is imported
    return peft is not None and isinstance(model, peft.PeftModel)


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


class CheckpointError(ValueError):
    """A run folder's state cannot be used safely or at all (the message names the file, why, and the fix)."""


@dataclass
class SavedState:
    """The trainer state of a checkpoint besides its weights, as read by :func:`read_saved_state`.

    Attributes:
        trainer: counters and where the run's files end.
        optimizer: ``{"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}``.
        rng: the RNG states, for :func:`restore_rng`.
    """

    trainer: TrainState
    optimizer: dict[str, Any]
    rng: dict[str, Any]


def load_trainer_state(path: str | os.PathLike) -> TrainState:
    """The checkpoint's ``trainer_state.json``; :class:`CheckpointError` when it is not one."""
    file = Path(path) / _STATE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        return TrainState(**data)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{file} is not a trainer state of gym-llm ({type(e).__name__}: {e}); resume a run "
                              "folder written by `gym-llm train`, or start a new run (drop --resume)") from e


def read_saved_state(path: str | os.PathLike) -> SavedState:
    """A checkpoint's trainer, optimizer and RNG state, read without running anything the files hold (module
    docstring); :class:`CheckpointError` names the file that holds more than tensors and plain values."""
    path = Path(path)
    optimizer = _load_data(path / "optimizer.pt", ("optimizer", "scheduler"))
    rng = _load_data(path / "rng.pt", ("torch", "numpy", "python"), old_numpy_state=True)
    return SavedState(load_trainer_state(path), optimizer, rng)


def _old_numpy_globals() -> list[Any]:
    """What an rng.pt written before the RNG state was stored as tensors needs besides tensors: numpy's state array
    (an ndarray of dtype uint32, rebuilt by numpy's ``_reconstruct``), under numpy 2's and numpy 1's module names."""
    from numpy._core.multiarray import _reconstruct

    return [_reconstruct, (_reconstruct, "numpy.core.multiarray._reconstruct"), np.ndarray, np.dtype,
            type(np.dtype(np.uint32))]


def _load_data(file: Path, keys: tuple[str, ...], *, old_numpy_state: bool = False) -> dict[str, Any]:
    import pickle

    import torch

    allowed = _old_numpy_globals() if old_numpy_state else []
    try:
        with torch.serialization.safe_globals(allowed):
            saved = torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise CheckpointError(f"{file} is missing: the checkpoint is incomplete; {_FRESH_START.format(file.parent)}") \
            from e
    except pickle.UnpicklingError as e:
        named = re.search(r"GLOBAL (\S+)", str(e))
        detail = f"it names {named.group(1)}" if named else (str(e).splitlines() or [type(e).__name__])[0]
        raise CheckpointError(
            f"{file}: refusing to load it. It holds more than tensors and plain values ({detail}), which gym-llm's "
            "trainer never writes; unpickling it (torch.load with weights_only=False) could run code it names, so it "
            "is read with weights_only=True only. The checkpoint was written by something else or changed since: do "
            f"not resume it. {_FRESH_START.format(file.parent)}") from e
    if not isinstance(saved, dict) or not set(keys) <= set(saved):
        got = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
        raise CheckpointError(f"{file} is not gym-llm trainer state (expected the keys {list(keys)}, got {got}); "
                              f"{_FRESH_START.format(file.parent)}")
    return saved


_FRESH_START = ("To keep its weights (safetensors, read without running code), start a new run from them: --model {} "
                "with a new --out, without --resume")


def _rng_state() -> dict[str, Any]:
    """Every RNG state as tensors and plain values (what ``weights_only=True`` reads back)."""
    import torch

    bit_generator, key, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "numpy": {"bit_generator": bit_generator, "key": torch.from_numpy(key.astype(np.int64)),  # (624,)
                      "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
            "python": random.getstate(),  # (version, tuple of 625 ints, gauss_next)
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def restore_rng(saved: dict[str, Any]) -> None:
    """Set the torch, numpy, Python (and CUDA) RNGs to ``saved`` (:attr:`SavedState.rng`; a state written before it
    held tensors, with numpy's state a tuple, too)."""
    import torch

    torch.set_rng_state(saved["torch"])
    state = saved["numpy"]
    if isinstance(state, dict):
        state = (state["bit_generator"], state["key"].numpy().astype(np.uint32), state["pos"], state["has_gauss"],
                 state["cached_gaussian"])
    np.random.set_state(state)
    random.setstate(saved["python"])
    if saved.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
