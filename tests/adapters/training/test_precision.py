"""Mixed precision moves the weights like fp32 training; pure bf16 weights (what the GPU default used to be) do not.

Ten AdamW steps at lr 1e-5 on the same SFT batch of the tiny Qwen2 model, three ways: fp32; the trainer's
"bfloat16" (fp32 master weights and optimizer state, bf16 autocast for the forward/backward); and plain bf16
weights. Movement is the relative L2 distance from the start; "changed" the fraction of parameters that moved at
all. Runs on CPU (bf16 autocast on CPU), as on GPU.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import AutoModelForCausalLM

from gym_llm_adapters.logprobs import token_logprobs
from gym_llm_adapters.training.precision import autocast, master_dtype, weight_movement

STEPS, LR = 10, 1e-5


def train(model_path, mode: str) -> tuple[float, float]:
    torch.manual_seed(0)
    storage = torch.bfloat16 if mode == "pure_bf16" else getattr(torch, master_dtype("bfloat16" if mode == "mixed"
                                                                                    else "float32"))
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=storage)
    model.train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (4, 32), generator=g)
    attention = torch.ones_like(ids)
    mask = torch.zeros_like(ids)
    mask[:, 8:] = 1
    for _ in range(STEPS):
        context = autocast("cpu", "bfloat16") if mode == "mixed" else contextlib.nullcontext()
        with context:
            logprobs = token_logprobs(model, ids, attention, mask)
        loss = -(logprobs.float() * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(p.dtype == storage for p in model.parameters())
    return weight_movement(before, model)


@pytest.fixture(scope="module")
def runs(tiny_model_path):
    return {mode: train(tiny_model_path, mode) for mode in ("fp32", "mixed", "pure_bf16")}


def test_bf16_training_keeps_fp32_master_weights():
    assert master_dtype("bfloat16") == master_dtype("float32") == "float32"
    with pytest.raises(ValueError, match="dtype must be"):
        master_dtype("float16")


def test_mixed_precision_moves_the_weights_like_fp32(runs):
    (fp32_move, fp32_changed), (mixed_move, mixed_changed) = runs["fp32"], runs["mixed"]
    assert fp32_move > 0 and fp32_changed > 0.5  # (embedding rows of tokens not in the batch get no gradient)
    assert 0.8 < mixed_move / fp32_move < 1.25, runs
    assert mixed_changed > 0.95 * fp32_changed, runs


def test_pure_bf16_weights_would_lose_the_updates(runs):
    """What the old GPU default did: most updates round away (the check above could fail)."""
    (fp32_move, _), (bf16_move, bf16_changed) = runs["fp32"], runs["pure_bf16"]
    assert bf16_move / fp32_move < 0.6 or bf16_changed < 0.5, runs
