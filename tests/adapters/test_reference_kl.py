"""KL estimators against closed-form KL on categorical distributions; ReferenceKL on a real model."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from gym_llm_adapters.kl import KLOutput, ReferenceKL, ReferenceKLConfig, kl_estimate
from gym_llm_adapters.logprobs import token_logprobs
from gym_llm_adapters.types import RolloutBatch

P = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04], dtype=torch.float64)
Q = torch.tensor([0.20, 0.20, 0.20, 0.20, 0.10, 0.10], dtype=torch.float64)


def closed_form(p: torch.Tensor, q: torch.Tensor) -> dict[str, float]:
    """Exact E_p[k] and Var_p[k] of each estimator, by summing over the support."""
    log_ratio = p.log() - q.log()
    values = {"k1": log_ratio, "k2": 0.5 * log_ratio**2, "k3": torch.expm1(-log_ratio) + log_ratio}
    out = {"kl": float((p * log_ratio).sum())}
    for name, v in values.items():
        mean = float((p * v).sum())
        out[name] = mean
        out[name + "_var"] = float((p * (v - mean) ** 2).sum())
    return out


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_sample_mean_matches_closed_form(estimator: str) -> None:
    exact = closed_form(P, Q)
    n = 200_000
    tokens = torch.multinomial(P, n, replacement=True, generator=torch.Generator().manual_seed(0))
    estimates = kl_estimate(P.log()[tokens], Q.log()[tokens], estimator)
    standard_error = math.sqrt(exact[estimator + "_var"] / n)
    assert float(estimates.mean()) == pytest.approx(exact[estimator], abs=5 * standard_error)
    if estimator in ("k1", "k3"):  # unbiased: the expectation is the KL itself
        assert exact[estimator] == pytest.approx(exact["kl"], rel=1e-12)
    else:  # k2: 0.5 E_p[log(p/q)^2], biased upward here
        assert exact["k2"] > exact["kl"]
    if estimator != "k1":
        assert bool((estimates >= 0).all())
    else:
        assert bool((estimates < 0).any())  # k1 is negative on tokens q likes more than p


def test_k2_is_kl_to_second_order_and_k3_has_lower_variance_than_k1() -> None:
    close_q = P * torch.exp(0.05 * torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0], dtype=torch.float64))
    close_q = close_q / close_q.sum()
    exact = closed_form(P, close_q)
    assert exact["k2"] == pytest.approx(exact["kl"], rel=0.05)
    assert exact["k3_var"] < 0.01 * exact["k1_var"]
    far = closed_form(P, Q)
    assert far["k3_var"] < far["k1_var"]


def test_estimator_hand_values_and_mask() -> None:
    lp = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[True, True, False]])
    torch.testing.assert_close(kl_estimate(lp, ref, "k1", mask), torch.tensor([[0.5, -1.0, 0.0]]))
    torch.testing.assert_close(kl_estimate(lp, ref, "k2", mask), torch.tensor([[0.125, 0.5, 0.0]]))
    k3 = [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0, 0.0]
    torch.testing.assert_close(kl_estimate(lp, ref, "k3", mask), torch.tensor([k3]))
    with pytest.raises(ValueError, match="estimator must be one of"):
        kl_estimate(lp, ref, "k4")
    with pytest.raises(ValueError, match="same shape"):
        kl_estimate(lp, ref[:, :2])


@pytest.fixture(scope="module")
def models():
    from transformers import AutoModelForCausalLM

    from gym_llm_adapters.models.tiny import tiny_model_dir

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir(seed=0), dtype=torch.float32).eval()
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir(seed=1), dtype=torch.float32).eval()
    return policy, reference


def multi_turn_batch(policy, seed: int = 0) -> RolloutBatch:
    """Episodes laid out like the collector's: prompt, sampled turn, tool turn, sampled turn, padding."""
    g = torch.Generator().manual_seed(seed)
    B, S = 4, 16
    ids = torch.randint(3, 500, (B, S), generator=g)
    attention = torch.zeros(B, S, dtype=torch.int8)
    policy_mask = torch.zeros(B, S, dtype=torch.int8)
    for b, n in enumerate([16, 12, 14, 9]):
        attention[b, :n] = 1
        policy_mask[b, 4:n] = 1
        policy_mask[b, 7:9] = 0  # tool output: not the policy's
        ids[b, n:] = 0
    with torch.no_grad():
        engine = token_logprobs(policy, ids, attention, policy_mask)
    return RolloutBatch(
        input_ids=ids.numpy(), attention_mask=attention.numpy(), policy_mask=policy_mask.numpy(),
        logprobs=engine.numpy(), rewards=np.array([1.0, 0.0, 0.5, 1.0], np.float32),
        group_ids=np.array([0, 0, 1, 1]), task_ids=np.array([3, 3, 4, 4]), rounds=np.zeros(B, np.int64),
        versions=np.zeros(B, np.int64))


def test_zero_kl_against_an_identical_reference(models) -> None:
    policy, _ = models
    batch = multi_turn_batch(policy)
    for estimator in ("k1", "k2", "k3"):
        out = ReferenceKL(policy, ReferenceKLConfig(estimator=estimator, reward_coef=1.0))(batch)
        assert float(out.kl.abs().max()) < 1e-5
        torch.testing.assert_close(out.rewards, torch.from_numpy(batch.rewards), atol=1e-4, rtol=0)


def test_reference_logprobs_kl_and_shaped_rewards_match_naive(models) -> None:
    policy, reference = models
    batch = multi_turn_batch(policy)
    coef = 0.05
    out = ReferenceKL(reference, ReferenceKLConfig(estimator="k3", reward_coef=coef, micro_batch_size=3))(batch)
    assert isinstance(out, KLOutput)
    ids = torch.from_numpy(batch.input_ids)
    with torch.no_grad():
        logits = reference(input_ids=ids, attention_mask=torch.from_numpy(batch.attention_mask).long()).logits
    full = logits.log_softmax(-1)
    mask = batch.policy_mask.astype(bool)
    for b in range(len(batch)):
        total = 0.0
        for t in range(batch.input_ids.shape[1]):
            if not mask[b, t]:
                assert out.ref_logprobs[b, t] == 0 and out.kl[b, t] == 0
                continue
            ref_lp = float(full[b, t - 1, batch.input_ids[b, t]])
            assert float(out.ref_logprobs[b, t]) == pytest.approx(ref_lp, abs=1e-4)
            d = ref_lp - float(batch.logprobs[b, t])
            total += math.exp(d) - d - 1
        assert float(out.kl_per_sequence[b]) == pytest.approx(total, rel=1e-4)
        assert float(out.rewards[b]) == pytest.approx(batch.rewards[b] - coef * total, rel=1e-4, abs=1e-5)
    assert out.mean_kl_per_token(torch.from_numpy(mask)) == pytest.approx(float(out.kl.sum()) / mask.sum(), rel=1e-6)


def test_model_level_estimates_are_unbiased_for_the_next_token_kl(models) -> None:
    """Sample the next token from the policy many times: mean k1/k3 -> exact KL(p || q) at that position."""
    policy, reference = models
    prompt = torch.randint(3, 500, (1, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        p = policy(input_ids=prompt).logits[0, -1].double().softmax(-1)
        q = reference(input_ids=prompt).logits[0, -1].double().softmax(-1)
    exact = closed_form(p, q)
    n = 4096
    tokens = torch.multinomial(p, n, replacement=True, generator=torch.Generator().manual_seed(0))
    ids = torch.cat([prompt.expand(n, -1), tokens[:, None]], 1)
    policy_mask = torch.zeros_like(ids, dtype=torch.int8)
    policy_mask[:, -1] = 1
    logprobs = torch.zeros(ids.shape)
    logprobs[:, -1] = p.log()[tokens].float()
    for estimator in ("k1", "k3"):
        kl = ReferenceKL(reference, ReferenceKLConfig(estimator=estimator, micro_batch_size=1024))
        out = kl.compute(ids, torch.ones_like(ids), policy_mask, logprobs, torch.zeros(n))
        standard_error = math.sqrt(exact[estimator + "_var"] / n)
        assert float(out.kl_per_sequence.double().mean()) == pytest.approx(exact["kl"], abs=5 * standard_error)


def test_apply_returns_a_new_batch_and_leaves_the_input_alone(models) -> None:
    policy, reference = models
    batch = multi_turn_batch(policy)
    before = dataclasses.replace(batch, rewards=batch.rewards.copy())
    shaped = ReferenceKL(reference, ReferenceKLConfig(reward_coef=0.1)).apply(batch)
    assert batch.ref_logprobs is None and np.array_equal(batch.rewards, before.rewards)
    assert shaped.ref_logprobs.shape == batch.input_ids.shape and shaped.ref_logprobs.dtype == np.float32
    assert (shaped.rewards < batch.rewards).all()  # k3 > 0 on every non-empty episode
    unshaped = ReferenceKL(reference).apply(batch)
    assert np.array_equal(unshaped.rewards, batch.rewards)
    np.testing.assert_allclose(unshaped.ref_logprobs, shaped.ref_logprobs)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"estimator": "kl"}, "estimator must be one of"), ({"reward_coef": -0.1}, "reward_coef must be >= 0"),
     ({"temperature": 0}, "temperature must be > 0"), ({"micro_batch_size": 0}, "micro_batch_size")],
)
def test_config_rejects_bad_values(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        ReferenceKLConfig(**kwargs)


def test_rejects_wrong_inputs(models) -> None:
    policy, reference = models
    with pytest.raises(TypeError, match="nn.Module"):
        ReferenceKL("Qwen/Qwen2.5-0.5B")
    ref = ReferenceKL(reference)
    with pytest.raises(TypeError, match="expects a RolloutBatch"):
        ref({"input_ids": None})
    batch = multi_turn_batch(policy)
    t = batch.to_torch()
    with pytest.raises(ValueError, match=r"logprobs must have shape \(4, 16\)"):
        ref.compute(t["input_ids"], t["attention_mask"], t["policy_mask"], t["logprobs"][:, :3], t["rewards"])
