"""SFTLoss against naive loops and hand values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gym_llm_adapters.losses import SFTLoss, SFTLossConfig
from gym_llm_adapters.types import RolloutBatch


def naive_sft(logp, ref, mask, cfg: SFTLossConfig) -> float:
    def k(lp, r):
        d = lp - r
        return {"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) - 1 + d}[cfg.kl_estimator]

    def term(lp, r):
        if cfg.objective == "nll":
            return -lp
        return -math.log(1 / (1 + math.exp(-cfg.minor_beta * (lp - r))))

    rows = [[(term(logp[b][t], ref[b][t]), k(logp[b][t], ref[b][t])) for t in range(len(mask[b])) if mask[b][t]]
            for b in range(len(mask))]
    if cfg.aggregation == "token_mean":
        flat = [x for row in rows for x in row]
        nll, kl = sum(x[0] for x in flat) / len(flat), sum(x[1] for x in flat) / len(flat)
    else:
        nll = sum(sum(x[0] for x in row) / max(len(row), 1) for row in rows) / len(rows)
        kl = sum(sum(x[1] for x in row) / max(len(row), 1) for row in rows) / len(rows)
    return nll + cfg.kl_coef * kl


@pytest.mark.parametrize("cfg", [
    SFTLossConfig(),
    SFTLossConfig(aggregation="sequence_mean"),
    SFTLossConfig(kl_coef=0.3),
    SFTLossConfig(kl_coef=0.1, kl_estimator="k2", aggregation="sequence_mean"),
    SFTLossConfig(objective="minor_sft", minor_beta=0.5),
    SFTLossConfig(objective="minor_sft", kl_coef=0.2, kl_estimator="k2"),
], ids=str)
def test_matches_naive(cfg: SFTLossConfig) -> None:
    g = torch.Generator().manual_seed(0)
    logp = -3 * torch.rand(3, 6, generator=g, dtype=torch.float64)
    ref = logp + 0.4 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 0, 1, 1], [0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    out = SFTLoss(cfg)(logp, mask=mask, ref_logprobs=ref)
    assert out.loss.item() == pytest.approx(naive_sft(logp.tolist(), ref.tolist(), mask.tolist(), cfg), rel=1e-12)
    assert out.num_tokens == 11
    assert (out.kl is None) == (cfg.kl_coef == 0)


def test_hand_values_and_gradient() -> None:
    logp = torch.tensor([[0.0, -1.0, -3.0], [0.0, -2.0, -7.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.bool)
    out = SFTLoss()(logp, mask=mask)
    assert out.loss.item() == pytest.approx(2.0)  # (1 + 3 + 2) / 3; the -7 is not an assistant token
    out.loss.backward()
    torch.testing.assert_close(logp.grad, -mask.float() / 3)
    assert SFTLoss(SFTLossConfig(aggregation="sequence_mean"))(logp, mask=mask).loss.item() == pytest.approx(2.0)
    assert SFTLoss()(logp, mask=mask, num_items=6).loss.item() == pytest.approx(1.0)
    assert out.metrics() == {"sft/loss": pytest.approx(2.0), "sft/nll": pytest.approx(2.0), "sft/num_tokens": 3.0}


def test_from_batch_and_missing_reference() -> None:
    B, S = 2, 4
    policy_mask = np.array([[0, 1, 1, 0], [0, 0, 1, 1]], np.int8)
    batch = RolloutBatch(input_ids=np.zeros((B, S), np.int64), attention_mask=np.ones((B, S), np.int8),
                         policy_mask=policy_mask, logprobs=np.zeros((B, S), np.float32),
                         rewards=np.zeros(B, np.float32), group_ids=np.arange(B), task_ids=np.arange(B),
                         rounds=np.zeros(B, np.int64), versions=np.zeros(B, np.int64))
    logp = -torch.ones(B, S)
    assert SFTLoss().from_batch(logp, batch).loss.item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="needs batch.ref_logprobs"):
        SFTLoss(SFTLossConfig(kl_coef=0.1)).from_batch(logp, batch)
    with pytest.raises(ValueError, match="ref_logprobs is required"):
        SFTLoss(SFTLossConfig(objective="minor_sft"))(logp, mask=torch.ones(B, S))


@pytest.mark.parametrize("kwargs, match", [
    ({"objective": "dpo"}, "objective must be"), ({"kl_coef": -1}, "kl_coef must be >= 0"),
    ({"aggregation": "dr_grpo"}, "aggregation must be"), ({"minor_beta": 0}, "minor_beta must be > 0"),
])
def test_config_rejects_bad_values(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        SFTLossConfig(**kwargs)
