"""The trainer's activation-memory cap: how many tokens one backward may take, and that cutting a batch into
micro-batches changes nothing but the summation order."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gym_llm_adapters.logprobs import token_logprobs
from gym_llm_adapters.losses import GRPOLoss, GRPOLossConfig, SFTLoss
from gym_llm_adapters.training import TrainConfig
from gym_llm_adapters.training.memory import backward_token_budget
from gym_llm_adapters.training.trainer import Trainer
from gym_llm_adapters.types import RolloutBatch, Trajectory

SMOLLM2 = dict(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
               num_key_value_heads=3, vocab_size=49152)  # SmolLM2-135M's config.json


def saved_bytes_per_token_and_layer(layers: int, tokens: int) -> float:
    """What autograd really keeps for the backward of a (float32) Llama with SmolLM2's widths, per token and
    layer: the bytes of every tensor saved during the forward, with the layer-independent part (embedding, head)
    removed by measuring two depths."""
    def saved(num_layers: int) -> int:
        torch.manual_seed(0)
        config = LlamaConfig(**{**SMOLLM2, "num_hidden_layers": num_layers, "vocab_size": 512})
        model = LlamaForCausalLM(config).float()
        ids = torch.randint(0, 512, (1, tokens))
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids).logits.sum()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        return sum(n for ptr, n in seen.items() if ptr not in params)

    return (saved(layers) - saved(1)) / ((layers - 1) * tokens)


def test_the_budget_covers_what_autograd_keeps_and_leaves_the_tiny_model_whole():
    measured = saved_bytes_per_token_and_layer(layers=3, tokens=256)
    smollm2 = backward_token_budget(types.SimpleNamespace(**SMOLLM2), 4.0)
    assumed = 4 * 2**30 / (30 * smollm2)  # bytes per token and layer the budget allows for
    assert measured <= assumed  # the cap holds: autograd keeps no more than the budget assumed...
    assert measured >= 0.8 * assumed  # ...and the budget does not waste a fifth of the memory it is given
    assert 2800 <= smollm2 <= 3200  # 64 episodes of ~300 tokens (19,200: 24 GB, OOM here) go in ~7 micro-batches
    tiny = backward_token_budget(types.SimpleNamespace(num_hidden_layers=2, hidden_size=128, intermediate_size=256), 4.0)
    assert tiny >= 128 * 256  # the README's main job (128 episodes of <= 256 tokens) stays one batch
    assert backward_token_budget(types.SimpleNamespace(**SMOLLM2), None) is None


def batch_of(rows: int, seed: int = 0) -> RolloutBatch:
    rng = np.random.default_rng(seed)
    trajectories = []
    for i in range(rows):
        prompt, sampled = int(rng.integers(3, 9)), int(rng.integers(2, 12))
        ids = rng.integers(0, 512, prompt + sampled)
        mask = np.r_[np.zeros(prompt, np.int8), np.ones(sampled, np.int8)]
        lps = np.r_[np.zeros(prompt, np.float32), rng.uniform(-4, -0.1, sampled).astype(np.float32)]
        trajectories.append(Trajectory(task_id=i // 4, group_id=i // 4, round=0, token_ids=ids, policy_mask=mask,
                                       logprobs=lps, prompt_length=prompt, rewards=[float(rng.random())],
                                       versions=[0], terminated=True, truncated=False))
    batch = RolloutBatch.from_trajectories(trajectories)
    return dataclasses.replace(batch, advantages=rng.normal(size=rows).astype(np.float32))


@pytest.mark.parametrize("loss", ["sft", "grpo"])
def test_micro_batches_give_the_whole_batchs_gradient(loss):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=512)).float()
    batch = batch_of(12)
    width = batch.input_ids.shape[1]
    sft, grpo = SFTLoss(), GRPOLoss(GRPOLossConfig(beta=0.0))

    def gradient(token_budget):
        trainer = types.SimpleNamespace(config=TrainConfig(algorithm="grpo", env_id="LLMGSM8K-v0", model="tiny", out_dir="unused"),
                                        _token_budget=token_budget)
        parts = list(Trainer._micro_batches(trainer, batch))
        model.zero_grad()
        counted = grpo.counted_tokens(batch, current_version=0) if loss == "grpo" else int(batch.policy_mask.sum())
        for part, _ in parts:
            t = part.to_torch()
            logprobs = token_logprobs(model, t["input_ids"], t["attention_mask"], t["policy_mask"])
            out = (sft.from_batch(logprobs, part, num_items=counted) if loss == "sft"
                   else grpo.from_batch(logprobs, part, num_items=counted, current_version=0))
            out.loss.backward()
        return parts, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    whole_parts, whole = gradient(None)
    split_parts, split = gradient(3 * width)  # three rows per micro-batch
    assert len(whole_parts) == 1 and [len(p) for p, _ in split_parts] == [3, 3, 3, 3]
    assert all(len(p) * width <= 3 * width for p, _ in split_parts)
    assert sum(w for _, w in split_parts) == pytest.approx(1.0)
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-7)
