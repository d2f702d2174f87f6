"""KL options against exact expected gradients, by enumeration of a small categorical policy.

The policy is ``pi = softmax(theta)`` over V tokens, the reference a fixed distribution. A loss option's expected
gradient under sampling from ``q`` (``q = pi`` on-policy, another distribution off-policy) is computed exactly:
``sum_x q(x) * grad loss(x)``, each ``grad loss(x)`` by autograd through the real :class:`GRPOLoss` /
:class:`SFTLoss` on a one-token sequence ``x``. It is compared with the gradient of the closed-form quantity the
option is documented to estimate: ``KL(pi || ref) = sum pi (log pi - log ref)`` (reverse) or
``KL(ref || pi)`` (forward), differentiated by autograd — not another copy of the estimator formula.
"""

from __future__ import annotations

import pytest
import torch

from gym_llm_adapters.kl import ReferenceKL, ReferenceKLConfig
from gym_llm_adapters.losses import GRPOLoss, GRPOLossConfig, SFTLoss, SFTLossConfig

V = 6
TOL = 1e-5


def distributions(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(V, generator=g, dtype=torch.float64)
    ref_logp = torch.log_softmax(torch.randn(V, generator=g, dtype=torch.float64), -1)
    old_logp = torch.log_softmax(theta + 0.7 * torch.randn(V, generator=g, dtype=torch.float64), -1)
    return theta, ref_logp, old_logp


def expected_grad(loss_fn, theta, ref_logp, sample_logp, *, old_logp=None) -> torch.Tensor:
    """sum_x q(x) * grad_theta loss(x), q = exp(sample_logp); old_logp: the sampling policy's log-probs for the loss
    (defaults to the current policy, detached: on-policy)."""
    total = torch.zeros(V, dtype=torch.float64)
    q = sample_logp.exp()
    for x in range(V):
        th = theta.clone().requires_grad_(True)
        logp = torch.log_softmax(th, -1)[x].reshape(1, 1)
        old = (old_logp[x] if old_logp is not None else logp.detach()).reshape(1, 1)
        out = loss_fn(logp, ref_logp[x].reshape(1, 1), old)
        grad, = torch.autograd.grad(out, th)
        total += q[x] * grad
    return total


def reverse_kl_grad(theta, ref_logp) -> torch.Tensor:
    th = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(th, -1)
    grad, = torch.autograd.grad((logp.exp() * (logp - ref_logp)).sum(), th)
    return grad


def forward_kl_grad(theta, ref_logp) -> torch.Tensor:
    th = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(th, -1)
    grad, = torch.autograd.grad((ref_logp.exp() * (ref_logp - logp)).sum(), th)
    return grad


def grpo_kl(estimator: str, correction: bool):
    """The KL part of GRPOLoss alone (zero advantages, beta 1)."""
    loss = GRPOLoss(GRPOLossConfig(beta=1.0, kl_estimator=estimator, kl_importance_correction=correction))

    def fn(logp, ref, old):
        mask = torch.ones_like(logp, dtype=torch.bool)
        return loss(logp, old_logprobs=old, ref_logprobs=ref, advantages=torch.zeros(1, dtype=logp.dtype),
                    mask=mask).loss
    return fn


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator,correction", [("k1", True), ("k3", True), ("k2", False)])
def test_allowed_grpo_kl_options_give_the_reverse_kl_gradient_on_policy(estimator, correction, seed):
    theta, ref_logp, _ = distributions(seed)
    pi_logp = torch.log_softmax(theta, -1)
    got = expected_grad(grpo_kl(estimator, correction), theta, ref_logp, pi_logp)
    want = reverse_kl_grad(theta, ref_logp)
    assert want.norm() > 0.05
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_corrected_options_stay_exact_off_policy(estimator):
    """Tokens sampled from an older policy: the ratio-weighted estimators still give the reverse-KL gradient."""
    theta, ref_logp, old_logp = distributions(3)
    got = expected_grad(grpo_kl(estimator, True), theta, ref_logp, old_logp, old_logp=old_logp)
    torch.testing.assert_close(got, reverse_kl_grad(theta, ref_logp), atol=TOL, rtol=0)


def test_k3_without_the_correction_is_the_forward_kl_gradient():
    theta, ref_logp, _ = distributions(4)
    got = expected_grad(grpo_kl("k3", False), theta, ref_logp, torch.log_softmax(theta, -1))
    torch.testing.assert_close(got, forward_kl_grad(theta, ref_logp), atol=TOL, rtol=0)
    assert (got - reverse_kl_grad(theta, ref_logp)).norm() > 0.01  # a different quantity, as documented


@pytest.mark.parametrize("estimator,correction,why", [("k1", False, "expected gradient 0"),
                                                      ("k2", True, "E\\[k1 \\+ k2\\]")])
def test_wrong_grpo_combinations_are_refused_naming_the_valid_ones(estimator, correction, why):
    with pytest.raises(ValueError, match=why) as caught:
        GRPOLossConfig(beta=0.1, kl_estimator=estimator, kl_importance_correction=correction)
    assert "k1 with the correction, k3 with the correction" in str(caught.value)
    GRPOLossConfig(beta=0.0, kl_estimator=estimator, kl_importance_correction=correction)  # unused: allowed
    # what the refusal prevents (measured by the same enumeration): the combination's gradient is wrong
    theta, ref_logp, _ = distributions(5)
    pi_logp = torch.log_softmax(theta, -1)

    def raw(logp, ref, old):
        d = logp - ref
        kl = d if estimator == "k1" else 0.5 * d * d
        return (kl * torch.exp(logp - old) if correction else kl).sum()
    got = expected_grad(raw, theta, ref_logp, pi_logp)
    assert (got - reverse_kl_grad(theta, ref_logp)).norm() > 0.05


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_sft_kl_term_depends_on_the_reference(estimator):
    """On dataset tokens (a fixed data distribution), the KL term's gradient must move with the reference."""
    theta, ref_logp, data_logp = distributions(6)
    with_kl, plain = SFTLoss(SFTLossConfig(kl_coef=1.0, kl_estimator=estimator)), SFTLoss(SFTLossConfig())

    def kl_only(logp, ref, _old):  # the KL term alone: the loss with it minus the loss without it
        mask = torch.ones_like(logp, dtype=torch.bool)
        return with_kl(logp, mask=mask, ref_logprobs=ref).loss - plain(logp, mask=mask).loss

    shifted = torch.log_softmax(ref_logp + torch.linspace(-2, 2, V, dtype=torch.float64), -1)
    a = expected_grad(kl_only, theta, ref_logp, data_logp)
    b = expected_grad(kl_only, theta, shifted, data_logp)
    assert (a - b).norm() > 0.05
    # and at ref == pi the pull vanishes: the data is not pushed away from the reference
    pi_logp = torch.log_softmax(theta, -1)
    torch.testing.assert_close(expected_grad(kl_only, theta, pi_logp, data_logp),
                               torch.zeros(V, dtype=torch.float64), atol=TOL, rtol=0)


def test_sft_k1_is_refused():
    with pytest.raises(ValueError, match="ignores the reference"):
        SFTLossConfig(kl_coef=0.1, kl_estimator="k1")
    SFTLossConfig(kl_coef=0.0, kl_estimator="k1")  # no KL term: allowed


def test_kl_shaping_after_advantages_is_refused(tmp_path):
    import numpy as np

    from gym_llm_adapters.types import RolloutBatch

    batch = RolloutBatch(input_ids=np.array([[1, 2, 3]]), policy_mask=np.array([[0, 1, 1]], np.int8),
                         attention_mask=np.ones((1, 3), np.int8), logprobs=np.zeros((1, 3), np.float32),
                         rewards=np.ones(1, np.float32), group_ids=np.zeros(1, np.int64),
                         task_ids=np.zeros(1, np.int64), rounds=np.zeros(1, np.int64), versions=np.zeros(1, np.int64),
                         advantages=np.zeros(1, np.float32))
    shaping = ReferenceKL(torch.nn.Identity(), ReferenceKLConfig(reward_coef=0.5))
    with pytest.raises(ValueError, match="before computing advantages"):
        shaping.apply(batch)
