"""Checkpoint state files: read as data only (``weights_only=True``), and a resume continues bit for bit.

The optimizer, scheduler and every RNG state (torch, numpy's legacy generator with a cached Gaussian, Python's
``random``) come back exactly; a folder written before the RNG state was stored as tensors still resumes; a file that
holds anything but tensors and plain values is refused, naming the file and the fix. (The crafted-folder attacks
through ``gym-llm train --resume`` are in ``tests/adapters/test_hostile_files.py``.)
"""

from __future__ import annotations

import functools
import json
import random

import numpy as np
import pytest
import torch

from gym_llm_adapters.training.checkpoint import (CheckpointError, TrainState, read_saved_state, restore_rng,
                                                  save_checkpoint)
from gym_llm_adapters.training.trainer import lr_factor


class Saves:
    """Stands in for the model and tokenizer: ``save_pretrained`` writes one file."""

    def save_pretrained(self, folder, **_):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text("{}")


def trained(seed: int = 0):
    """A small model, AdamW and the trainer's LambdaLR schedule after three steps."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    optimizer, scheduler = optimizer_for(model)
    for _ in range(3):
        step(model, optimizer, scheduler)
    return model, optimizer, scheduler


def optimizer_for(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = functools.partial(lr_factor, warmup=2, length=10, schedule="cosine")
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def step(model, optimizer, scheduler):
    inputs = torch.linspace(-1, 1, 32 * 8).reshape(32, 8)  # (B, 8)
    loss = model(inputs).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()


def draws():
    return (torch.rand(5).tolist(), np.random.standard_normal(5).tolist(), np.random.randint(0, 2**31, 3).tolist(),
            [random.random() for _ in range(3)], random.gauss(0, 1))


def state(step_: int = 3) -> TrainState:
    return TrainState(step=step_, phase="grpo", version=step_, rollout_records=0, reference=None, config={})


def test_resume_state_round_trips_bit_for_bit(tmp_path):
    model, optimizer, scheduler = trained()
    np.random.standard_normal()  # numpy's legacy generator now holds a cached Gaussian (has_gauss=1)
    random.gauss(0, 1)  # and Python's a gauss_next
    path = save_checkpoint(tmp_path, state(), model=Saves(), tokenizer=Saves(), optimizer=optimizer,
                           scheduler=scheduler, keep=2)
    expected = draws()
    saved = read_saved_state(path)
    assert saved.trainer == state()
    restore_rng(saved.rng)
    assert draws() == expected

    copy = trained(seed=1)[0]  # other weights and a fresh optimizer: the saved state replaces the optimizer's
    copy.load_state_dict(model.state_dict())
    resumed, resumed_scheduler = optimizer_for(copy)
    resumed.load_state_dict(saved.optimizer["optimizer"])
    resumed_scheduler.load_state_dict(saved.optimizer["scheduler"])
    assert resumed_scheduler.get_last_lr() == scheduler.get_last_lr()
    for _ in range(3):  # both go on: the same updates, bit for bit
        step(model, optimizer, scheduler)
        step(copy, resumed, resumed_scheduler)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), copy.state_dict().values()))
    assert scheduler.get_last_lr() == resumed_scheduler.get_last_lr()


def test_a_run_folder_from_before_the_tensor_rng_state_still_resumes(tmp_path):
    """rng.pt as the trainer wrote it before (numpy's state a tuple holding a uint32 array): read safely too."""
    model, optimizer, scheduler = trained()
    path = save_checkpoint(tmp_path, state(), model=Saves(), tokenizer=Saves(), optimizer=optimizer,
                           scheduler=scheduler, keep=2)
    np.random.standard_normal()
    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                "cuda": None}, path / "rng.pt")
    expected = draws()
    restore_rng(read_saved_state(path).rng)
    assert draws() == expected


class Opens:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.parametrize("name", ["optimizer.pt", "rng.pt"])
def test_state_files_that_are_not_plain_data_are_refused(tmp_path, name):
    _, optimizer, scheduler = trained()
    path = save_checkpoint(tmp_path, state(), model=Saves(), tokenizer=Saves(), optimizer=optimizer,
                           scheduler=scheduler, keep=2)
    marker = tmp_path / "ran"
    torch.save({"torch": Opens(marker), "optimizer": {}, "scheduler": {}}, path / name)
    with pytest.raises(CheckpointError, match=rf"{name}: refusing to load it.*it names .*open.*weights_only=True"
                                              rf".*--model {path}") as refused:
        read_saved_state(path)
    assert not marker.exists()
    assert "without --resume" in str(refused.value)

    torch.save([1, 2], path / name)  # plain data, but not trainer state
    with pytest.raises(CheckpointError, match=rf"{name} is not gym-llm trainer state \(expected the keys"):
        read_saved_state(path)
    (path / name).unlink()
    with pytest.raises(CheckpointError, match=rf"{name} is missing: the checkpoint is incomplete"):
        read_saved_state(path)


def test_a_trainer_state_that_is_not_one_is_refused(tmp_path):
    _, optimizer, scheduler = trained()
    path = save_checkpoint(tmp_path, state(), model=Saves(), tokenizer=Saves(), optimizer=optimizer,
                           scheduler=scheduler, keep=2)
    (path / "trainer_state.json").write_text(json.dumps({"step": 1, "surprise": True}))
    with pytest.raises(CheckpointError, match="trainer_state.json is not a trainer state of gym-llm"):
        read_saved_state(path)
