"""The model, batch and loss tests/adapters/training/test_fsdp.py and its torchrun script share."""

from __future__ import annotations

import torch

ROWS = list(range(8))


def build_model():
    from gym_llm_adapters.models.tiny import tiny_model_dir
    from gym_llm_adapters.training.setup import load_policy

    model, _ = load_policy(tiny_model_dir(tied=True), device="cpu", dtype="float32")
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """8 rows of 20 tokens, the last 15 scored; rows 5-7 shorter (left padding), as a real batch's are."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 100, (8, 20), generator=g)
    mask = torch.ones(8, 20, dtype=torch.long)
    mask[5:, :3] = 0
    score = torch.zeros(8, 20, dtype=torch.bool)
    score[:, 5:] = True
    return ids, mask, score


def loss_of(logprobs: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """A token mean over the *global* batch's scored tokens (as the trainer normalises each rank's share)."""
    return -logprobs.sum() / score.sum()
