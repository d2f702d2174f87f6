"""GRPOLoss against a naive per-token Python-loop implementation and hand-computed values."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from gym_llm_adapters.losses import GRPOLoss, GRPOLossConfig, importance_sampling_weights


def naive_is_weight(old, engine, mask, mode, lo, hi):
    """Per-token (or per-sequence) weights with plain Python floats, following TRL 1.16's documented modes."""
    B, S = len(old), len(old[0])
    lo_v = -math.inf if lo is None else lo
    hi_v = math.inf if hi is None else hi

    def bound(w):
        if mode.endswith("truncate"):
            return min(max(w, lo_v), hi_v)
        return 0.0 if (w < lo_v or w > hi_v) else w

    weights = [[1.0] * S for _ in range(B)]
    for b in range(B):
        if mode.startswith("sequence"):
            total = sum(old[b][t] - engine[b][t] for t in range(S) if mask[b][t])
            w = bound(math.exp(total))
            weights[b] = [w] * S
        else:
            for t in range(S):
                weights[b][t] = bound(math.exp(old[b][t] - engine[b][t])) if mask[b][t] else bound(1.0)
    return weights


def naive_grpo(logp, old, ref, engine, mask, adv, cfg: GRPOLossConfig) -> float:
    """The GRPO loss value by explicit loops over sequences and tokens."""
    B, S = len(logp), len(logp[0])
    eps_hi = cfg.eps_high
    weights = (naive_is_weight(old, engine, mask, cfg.importance_sampling, cfg.importance_sampling_clip_min,
                               cfg.importance_sampling_clip_max)
               if cfg.importance_sampling != "none" else [[1.0] * S for _ in range(B)])
    per_token = [[0.0] * S for _ in range(B)]
    for b in range(B):
        n = sum(mask[b])
        seq_log_ratio = sum(logp[b][t] - old[b][t] for t in range(S) if mask[b][t]) / max(n, 1)
        for t in range(S):
            if not mask[b][t]:
                continue
            a = adv[b]
            ratio = math.exp(seq_log_ratio if cfg.ratio_level == "sequence" else logp[b][t] - old[b][t])
            clipped = min(max(ratio, 1 - cfg.epsilon), 1 + eps_hi)
            unclipped = ratio if cfg.delta is None else min(ratio, cfg.delta)
            loss = -min(unclipped * a, clipped * a) * weights[b][t]
            if cfg.beta:
                d = ref[b][t] - logp[b][t]
                kl = math.exp(d) - d - 1
                if cfg.kl_importance_correction:
                    kl *= ratio
                loss += cfg.beta * kl
            per_token[b][t] = loss
    if cfg.aggregation == "token_mean":
        return sum(map(sum, per_token)) / max(sum(map(sum, mask)), 1)
    if cfg.aggregation == "sequence_mean":
        return sum(sum(per_token[b]) / max(sum(mask[b]), 1) for b in range(B)) / B
    return sum(map(sum, per_token)) / (B * cfg.max_completion_length)


def random_inputs(seed: int, B: int = 4, S: int = 7):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, S, generator=g, dtype=torch.float64) * 3
    old = logp + 0.3 * torch.randn(B, S, generator=g, dtype=torch.float64)
    engine = old + 0.4 * torch.randn(B, S, generator=g, dtype=torch.float64)
    ref = logp + 0.5 * torch.randn(B, S, generator=g, dtype=torch.float64)
    mask = torch.rand(B, S, generator=g) > 0.3
    mask[:, 0] = False
    mask[-1] = False  # one sequence with no policy tokens
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, ref, engine, mask, adv


CONFIGS = [
    GRPOLossConfig(),
    GRPOLossConfig(aggregation="sequence_mean", epsilon_high=0.28),
    GRPOLossConfig(aggregation="dr_grpo", max_completion_length=9, beta=0.04),
    GRPOLossConfig(beta=0.1, kl_importance_correction=False, delta=1.5, epsilon=0.1),
    GRPOLossConfig(importance_sampling="token_truncate", importance_sampling_clip_max=1.2, beta=0.02),
    GRPOLossConfig(importance_sampling="token_mask", importance_sampling_clip_min=0.8,
                   importance_sampling_clip_max=1.25, aggregation="sequence_mean"),
    GRPOLossConfig(importance_sampling="sequence_truncate", importance_sampling_clip_min=0.5,
                   importance_sampling_clip_max=2.0),
    GRPOLossConfig(importance_sampling="sequence_mask", importance_sampling_clip_max=1.5, beta=0.3),
    GRPOLossConfig(ratio_level="sequence", epsilon=0.05, beta=0.05, aggregation="dr_grpo",
                   max_completion_length=7),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.aggregation}-{c.importance_sampling}-{c.ratio_level}")
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_matches_naive_loops(cfg: GRPOLossConfig, seed: int) -> None:
    logp, old, ref, engine, mask, adv = random_inputs(seed)
    out = GRPOLoss(cfg)(logp, mask=mask, advantages=adv, old_logprobs=old, engine_logprobs=engine, ref_logprobs=ref)
    expected = naive_grpo(logp.tolist(), old.tolist(), ref.tolist(), engine.tolist(), mask.tolist(), adv.tolist(), cfg)
    assert out.loss.item() == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_hand_computed_single_token() -> None:
    # One policy token, ratio e^0.5 = 1.6487 clipped to 1.2 (A > 0): loss = -1.2 * 2 = -2.4.
    logp = torch.tensor([[0.0, -0.5]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[False, True]])
    out = GRPOLoss()(logp, mask=mask, advantages=torch.tensor([2.0], dtype=torch.float64), old_logprobs=old)
    assert out.loss.item() == pytest.approx(-2.4)
    out.loss.backward()
    assert logp.grad.abs().sum().item() == 0.0  # clipped: no gradient
    assert out.clip_high_fraction.item() == 1.0 and out.clip_low_fraction.item() == 0.0
    # Same with A < 0: min picks the unclipped branch: loss = 1.6487 * 2, gradient = ratio * 2.
    logp.grad = None
    out = GRPOLoss()(logp, mask=mask, advantages=torch.tensor([-2.0], dtype=torch.float64), old_logprobs=old)
    assert out.loss.item() == pytest.approx(2 * math.exp(0.5))
    out.loss.backward()
    assert logp.grad[0, 1].item() == pytest.approx(2 * math.exp(0.5))


def test_hand_computed_kl_and_aggregations() -> None:
    # On-policy (ratio 1), A = 0: only the KL term: k3 with d = ref - logp.
    logp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -1.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[0.0, -2.0, -1.0], [0.0, -1.5, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[False, True, True], [False, True, False]])
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    kl = [[k3(-1.0), k3(1.0)], [k3(-0.5)]]
    zero = torch.zeros(2, dtype=torch.float64)
    out = GRPOLoss(GRPOLossConfig(beta=0.5))(logp, mask=mask, advantages=zero, ref_logprobs=ref)
    assert out.loss.item() == pytest.approx(0.5 * (kl[0][0] + kl[0][1] + kl[1][0]) / 3)
    assert out.kl.item() == pytest.approx((kl[0][0] + kl[0][1] + kl[1][0]) / 3)
    metrics = out.metrics()
    assert metrics["grpo/kl"] == pytest.approx(out.kl.item()) and metrics["grpo/ratio_mean"] == pytest.approx(1.0)
    assert "grpo/is_weight_mean" not in metrics and metrics["grpo/policy_loss"] == 0.0
    out = GRPOLoss(GRPOLossConfig(beta=0.5, aggregation="sequence_mean"))(
        logp, mask=mask, advantages=zero, ref_logprobs=ref)
    assert out.loss.item() == pytest.approx(0.5 * ((kl[0][0] + kl[0][1]) / 2 + kl[1][0]) / 2)
    out = GRPOLoss(GRPOLossConfig(beta=0.5, aggregation="dr_grpo", max_completion_length=10))(
        logp, mask=mask, advantages=zero, ref_logprobs=ref)
    assert out.loss.item() == pytest.approx(0.5 * (kl[0][0] + kl[0][1] + kl[1][0]) / 20)
    out = GRPOLoss(GRPOLossConfig(beta=0.5))(logp, mask=mask, advantages=zero, ref_logprobs=ref, num_items=6)
    assert out.loss.item() == pytest.approx(0.5 * (kl[0][0] + kl[0][1] + kl[1][0]) / 6)


def test_on_policy_gradient_is_advantage_weighted_score() -> None:
    # With old = logp.detach(), d loss / d logp_t = -A_i / n_tokens (token mean), the policy-gradient form.
    logp = torch.tensor([[0.0, -1.0, -0.5], [0.0, -0.2, -0.3]], requires_grad=True)
    mask = torch.tensor([[False, True, True], [False, True, True]])
    adv = torch.tensor([1.0, -2.0])
    GRPOLoss()(logp, mask=mask, advantages=adv).loss.backward()
    expected = torch.tensor([[0.0, -0.25, -0.25], [0.0, 0.5, 0.5]])
    torch.testing.assert_close(logp.grad, expected)


def test_importance_sampling_weights_hand_values() -> None:
    old = torch.tensor([[0.0, -1.0, -1.0]])
    engine = torch.tensor([[0.0, -2.0, -0.9]])
    mask = torch.tensor([[False, True, True]])
    w = importance_sampling_weights(old, engine, mask, "token_truncate", clip_max=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, math.exp(-0.1)]]))
    w = importance_sampling_weights(old, engine, mask, "token_mask", clip_max=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, math.exp(-0.1)]]))
    w = importance_sampling_weights(old, engine, mask, "sequence_truncate", clip_max=3.0)
    torch.testing.assert_close(w, torch.tensor([[math.exp(0.9)]]))
    w = importance_sampling_weights(old, engine, mask, "sequence_mask", clip_min=0.5, clip_max=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0]]))
    nan_engine = torch.tensor([[float("nan"), float("nan"), -1.0]])
    w = importance_sampling_weights(old, nan_engine, mask, "token_truncate", clip_max=2.0)
    torch.testing.assert_close(w, torch.ones(1, 3))  # unknown engine log-probs: no correction


def test_from_batch_uses_batch_fields() -> None:
    from gym_llm_adapters.types import RolloutBatch

    B, S = 2, 5
    rng = np.random.default_rng(0)
    policy_mask = np.array([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=np.int8)
    batch = RolloutBatch(
        input_ids=rng.integers(0, 10, (B, S)), attention_mask=np.ones((B, S), np.int8), policy_mask=policy_mask,
        logprobs=(-rng.random((B, S)) * policy_mask).astype(np.float32), rewards=np.array([1.0, 0.0], np.float32),
        group_ids=np.zeros(B, np.int64), task_ids=np.zeros(B, np.int64), rounds=np.zeros(B, np.int64),
        versions=np.zeros(B, np.int64), ref_logprobs=(-rng.random((B, S)) * policy_mask).astype(np.float32),
        advantages=np.array([0.7, -0.7], np.float32))
    cfg = GRPOLossConfig(beta=0.1, importance_sampling="token_truncate")
    logp = torch.from_numpy(batch.logprobs) + 0.1 * torch.from_numpy(policy_mask).float()
    got = GRPOLoss(cfg).from_batch(logp, batch)
    t = batch.to_torch()
    want = GRPOLoss(cfg)(logp, mask=t["policy_mask"], advantages=t["advantages"], engine_logprobs=t["logprobs"],
                         ref_logprobs=t["ref_logprobs"])
    assert got.loss.item() == pytest.approx(want.loss.item())
    assert got.is_weight_max.item() == pytest.approx(math.exp(0.1), rel=1e-5)
    with pytest.raises(ValueError, match="advantages is None"):
        GRPOLoss().from_batch(logp, dataclasses.replace(batch, advantages=None))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"epsilon": 1.5}, "epsilon must be in"),
        ({"aggregation": "dr_grpo"}, "max_completion_length"),
        ({"aggregation": "seq"}, "aggregation must be one of"),
        ({"delta": 1.1}, "delta must be >"),
        ({"beta": -1.0}, "beta must be >= 0"),
        ({"importance_sampling": "token"}, "importance_sampling must be one of"),
        ({"importance_sampling": "token_truncate", "importance_sampling_clip_max": None}, "needs importance"),
        ({"importance_sampling_clip_min": 3.0, "importance_sampling_clip_max": 2.0}, "must be <"),
    ],
)
def test_config_rejects_bad_values(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        GRPOLossConfig(**kwargs)


def test_call_rejects_missing_or_misshaped_inputs() -> None:
    logp, mask, adv = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), torch.zeros(2)
    with pytest.raises(ValueError, match="ref_logprobs is required"):
        GRPOLoss(GRPOLossConfig(beta=0.1))(logp, mask=mask, advantages=adv)
    with pytest.raises(ValueError, match="engine_logprobs is required"):
        GRPOLoss(GRPOLossConfig(importance_sampling="token_truncate"))(logp, mask=mask, advantages=adv)
    with pytest.raises(ValueError, match=r"mask must have shape \(2, 3\)"):
        GRPOLoss()(logp, mask=mask[:, :2], advantages=adv)
    with pytest.raises(ValueError, match="advantages must be a tensor of shape"):
        GRPOLoss()(logp, mask=mask, advantages=torch.zeros(3))
