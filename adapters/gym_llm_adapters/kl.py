"""Reference-model KL: one teacher-forced forward of a frozen reference model over the exact sampled tokens.

The policy's log-probs come from the engine that sampled the tokens (``RolloutBatch.logprobs``); the reference
model only scores the same tokens, so one forward per batch is all the KL costs. The per-token estimate is
either subtracted from the episode reward (``reward_coef``) or kept for the loss (``RolloutBatch.ref_logprobs``,
read by :class:`~gym_llm_adapters.losses.GRPOLoss` with ``beta``).

Estimators of ``KL(pi || pi_ref) = E_{x ~ pi}[log pi(x) - log pi_ref(x)]`` from tokens sampled from ``pi``
(J. Schulman, "Approximating KL Divergence", 2020, http://joschu.net/blog/kl-approx.html), with
``log_ratio = log pi(x) - log pi_ref(x)`` and ``r = pi_ref(x) / pi(x) = exp(-log_ratio)``:

====  =====================================  ==========================================================
name  per-token value                        expectation under x ~ pi
====  =====================================  ==========================================================
k1    ``log_ratio``                          ``KL(pi || pi_ref)`` exactly (unbiased; can be negative,
                                             high variance)
k2    ``0.5 * log_ratio ** 2``               ``0.5 * E_pi[(log pi - log pi_ref)^2]``: equals KL to second
                                             order when the two are close, biased (upward for small
                                             divergences) otherwise; always >= 0, low variance
k3    ``(r - 1) - log r``                    ``KL(pi || pi_ref)`` exactly (unbiased, since
      ``= exp(-log_ratio) - 1 + log_ratio``  ``E_pi[r] = 1``); always >= 0, low variance. Used by
                                             GRPO (DeepSeekMath) and TRL.
====  =====================================  ==========================================================
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Literal

import numpy as np
import torch
from torch import nn

from gym_llm_adapters.logprobs import DEFAULT_CHUNK_BYTES, token_logprobs
from gym_llm_adapters.types import RolloutBatch

__all__ = ["KLEstimator", "kl_estimate", "ReferenceKLConfig", "KLOutput", "ReferenceKL"]

logger = logging.getLogger(__name__)

KLEstimator = Literal["k1", "k2", "k3"]
_ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: KLEstimator = "k3",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)`` at tokens sampled from ``pi`` (see the module table).

    Args:
        logprobs: ``(...)`` ``log pi(x_t)`` of the sampled tokens.
        ref_logprobs: ``(...)`` ``log pi_ref(x_t)`` of the same tokens.
        estimator: ``"k1"`` (``log_ratio``), ``"k2"`` (``0.5 * log_ratio**2``) or ``"k3"``
            (``exp(-log_ratio) - 1 + log_ratio``), with ``log_ratio = logprobs - ref_logprobs``.
        mask: optional ``(...)`` bool/0-1; positions where it is 0 are set to 0.0.

    Returns:
        ``(...)`` float, differentiable in both inputs.

    >>> lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    >>> kl_estimate(lp, ref, "k1")
    tensor([ 0.5000, -1.0000])
    >>> kl_estimate(lp, ref, "k3").round(decimals=4)
    tensor([0.1065, 0.7183])
    """
    if estimator not in _ESTIMATORS:
        raise ValueError(f"estimator must be one of {_ESTIMATORS}; got {estimator!r}.")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs and ref_logprobs must have the same shape; got {tuple(logprobs.shape)} and "
            f"{tuple(ref_logprobs.shape)}."
        )
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = 0.5 * log_ratio.square()
    else:
        kl = torch.expm1(-log_ratio) + log_ratio  # (r - 1) - log r, expm1 for accuracy near r = 1
    if mask is not None:
        kl = torch.where(mask.bool(), kl, torch.zeros((), dtype=kl.dtype, device=kl.device))
    return kl


@dataclass(frozen=True, kw_only=True)
class ReferenceKLConfig:
    """Settings of :class:`ReferenceKL`.

    Attributes:
        estimator: which per-token estimator of ``KL(pi || pi_ref)`` to report (``"k1"``, ``"k2"``, ``"k3"``;
            see :mod:`gym_llm_adapters.kl`). Default ``"k3"``: unbiased and non-negative.
        reward_coef: when > 0, :meth:`ReferenceKL.apply` subtracts ``reward_coef * sum_t kl_t`` (sum over the
            episode's policy tokens) from each episode's reward — the KL-shaped reward of InstructGPT-style
            RLHF. 0 (default) leaves rewards alone and only stores ``ref_logprobs`` for a loss-side KL term
            (GRPO's ``beta``). Must be >= 0.
        temperature / top_p / top_k: the sampler's settings, applied to the reference exactly as to the policy
            (:func:`~gym_llm_adapters.logprobs.token_logprobs`): keep them equal to those the policy's log-probs
            describe — the sampling settings with an engine in ``logprobs_mode="processed"`` (then the KL is between
            the distribution actually sampled from and the reference's, and a reference equal to the policy gives
            exactly 0), or ``1.0 / 1.0 / 0`` with raw log-probs (the engines' default). ``temperature > 0``,
            ``top_p`` in ``(0, 1]``, ``top_k >= 0`` (0 and 1.0 disable them).
        micro_batch_size: at most this many rows per reference forward; None = no row limit. Must be >= 1.
        max_tokens_per_forward: at most ``rows * padded_width`` tokens per reference forward (rows go longest
            first and each forward is trimmed to its longest row, so this also skips most padding). The default
            4096 measured fastest on CPU (bench/kl.py) and bounds activation memory; None = one forward over
            the whole batch. Must be >= 1.
        chunk_bytes: memory budget of one float32 ``(rows, V)`` logits tile of the output projection. Larger
            tiles run marginally faster; the default (128 MiB) is far below one ``(B, S, V)`` logits tensor.
        share_prefix: run each distinct prompt of the batch once and its completions on its KV cache (GRPO
            groups; :func:`~gym_llm_adapters.logprobs.token_logprobs`): equal up to float rounding, less compute.
    """

    estimator: KLEstimator = "k3"
    reward_coef: float = 0.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    micro_batch_size: int | None = None
    max_tokens_per_forward: int | None = 4096
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    share_prefix: bool = False

    def __post_init__(self) -> None:
        if self.estimator not in _ESTIMATORS:
            raise ValueError(f"estimator must be one of {_ESTIMATORS}; got {self.estimator!r}.")
        if not self.reward_coef >= 0:
            raise ValueError(f"reward_coef must be >= 0; got {self.reward_coef}. Use 0 to leave rewards alone.")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0; got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it); got {self.top_p}.")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables it); got {self.top_k!r}.")
        for name in ("micro_batch_size", "max_tokens_per_forward"):
            limit = getattr(self, name)
            if limit is not None and limit < 1:
                raise ValueError(f"{name} must be >= 1 or None; got {limit}.")
        if self.chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1; got {self.chunk_bytes}.")


@dataclass(frozen=True)
class KLOutput:
    """What :class:`ReferenceKL` computed for one batch (tensors on the reference model's device).

    Attributes:
        ref_logprobs: ``(B, S)`` float32 ``log pi_ref(token_t | tokens_<t)`` at policy tokens, 0.0 elsewhere.
        kl: ``(B, S)`` float32 per-token KL estimate at policy tokens, 0.0 elsewhere.
        kl_per_sequence: ``(B,)`` float32 ``sum_t kl_t`` over each episode's policy tokens.
        rewards: ``(B,)`` float32 episode rewards after the KL penalty
            (``rewards - reward_coef * kl_per_sequence``; unchanged when ``reward_coef == 0``).
    """

    ref_logprobs: torch.Tensor
    kl: torch.Tensor
    kl_per_sequence: torch.Tensor
    rewards: torch.Tensor

    def mean_kl_per_token(self, policy_mask: torch.Tensor) -> float:
        """The KL estimate averaged over all policy tokens of the batch (a scalar to log)."""
        return float(self.kl.sum() / policy_mask.sum().clamp(min=1))


def _model_device(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


class ReferenceKL:
    """Reference log-probs and the KL of the sampling policy to a frozen reference model, for a batch.

    One teacher-forced pass of ``model`` over ``batch.input_ids`` (under ``torch.inference_mode``, in
    length-sorted micro-batches of at most ``max_tokens_per_forward`` tokens) scores the exact sampled tokens; only positions where ``policy_mask`` is
    1 (assistant tokens; prompt, tool and env tokens never count) are projected through the output head.
    The policy side is ``batch.logprobs``, the engine's log-probs of the same tokens.

    Args:
        model: a transformers causal LM, the reference policy. It is put in eval mode (no dropout) and never
            receives gradients.
        config: a :class:`ReferenceKLConfig` (defaults: k3, no reward shaping).
        scope: a context every reference forward runs in, for a reference that shares the policy's weights: e.g. a
            PEFT model's ``disable_adapter`` with ``model`` the policy itself (the reference is then the base with
            the LoRA adapter off, and costs no second copy of the weights). ``model`` is then put in eval mode for
            the forward only, and back to its mode after (the policy keeps training).

    Example::

        ref = ReferenceKL(AutoModelForCausalLM.from_pretrained(path), ReferenceKLConfig(reward_coef=0.05))
        batch = ref.apply(batch)   # batch.ref_logprobs filled, batch.rewards KL-shaped
    """

    def __init__(self, model: nn.Module, config: ReferenceKLConfig | None = None, *,
                 scope: Callable[[], ContextManager[Any]] | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch nn.Module (a transformers causal LM); got {type(model).__name__}.")
        self.scope = scope
        self.model = model if scope is not None else model.eval()
        self.config = config if config is not None else ReferenceKLConfig()

    @contextlib.contextmanager
    def _scoring(self) -> Iterator[None]:
        """The reference forward's context: ``scope()`` (if any) with the shared model in eval mode meanwhile."""
        if self.scope is None:
            yield
            return
        training = self.model.training
        self.model.eval()
        try:
            with self.scope():
                yield
        finally:
            self.model.train(training)

    @property
    def device(self) -> torch.device:
        return _model_device(self.model)

    def ref_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     policy_mask: torch.Tensor) -> torch.Tensor:
        """``(B, S)`` reference log-probs of ``input_ids`` at ``policy_mask`` positions (0.0 elsewhere)."""
        config = self.config
        with self._scoring(), torch.inference_mode():
            ref = token_logprobs(
                self.model,
                input_ids.to(self.device),
                attention_mask.to(self.device),
                policy_mask.to(self.device),
                temperature=config.temperature,
                top_p=config.top_p,
                top_k=config.top_k,
                micro_batch_size=config.micro_batch_size,
                max_tokens_per_forward=config.max_tokens_per_forward,
                chunk_bytes=config.chunk_bytes,
                share_prefix=config.share_prefix,
            )
        return ref.clone()  # a normal tensor (inference tensors cannot be modified in place later)

    def compute(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, policy_mask: torch.Tensor,
                logprobs: torch.Tensor, rewards: torch.Tensor) -> KLOutput:
        """The KL for tensors laid out like :class:`RolloutBatch` (see :meth:`__call__`)."""
        B, S = input_ids.shape
        for name, value, shape in (("logprobs", logprobs, (B, S)), ("rewards", rewards, (B,))):
            if tuple(value.shape) != shape:
                raise ValueError(f"{name} must have shape {shape} to match input_ids; got {tuple(value.shape)}.")
        ref = self.ref_logprobs(input_ids, attention_mask, policy_mask)  # (B, S)
        mask = policy_mask.to(ref.device).bool()
        with torch.no_grad():
            kl = kl_estimate(logprobs.to(ref.device, torch.float32), ref, self.config.estimator, mask)  # (B, S)
            kl_per_sequence = kl.sum(-1)  # (B,)
            shaped = rewards.to(ref.device, torch.float32)
            if self.config.reward_coef:
                shaped = shaped - self.config.reward_coef * kl_per_sequence
        return KLOutput(ref_logprobs=ref, kl=kl, kl_per_sequence=kl_per_sequence, rewards=shaped)

    def __call__(self, batch: RolloutBatch) -> KLOutput:
        """Score ``batch`` with the reference model and estimate the per-token KL at its policy tokens."""
        if not isinstance(batch, RolloutBatch):
            raise TypeError(f"ReferenceKL expects a RolloutBatch; got {type(batch).__name__}. "
                            "For raw tensors call ReferenceKL.compute(...).")
        t = batch.to_torch()
        return self.compute(t["input_ids"], t["attention_mask"], t["policy_mask"], t["logprobs"], t["rewards"])

    def apply(self, batch: RolloutBatch) -> RolloutBatch:
        """A copy of ``batch`` with ``ref_logprobs`` set and, when ``reward_coef > 0``, KL-shaped ``rewards``.

        The input batch is not modified. With ``reward_coef > 0`` it must not have advantages yet (they would not see
        the shaping): the order is ``apply`` first, then advantages — a batch with advantages is refused.
        """
        if self.config.reward_coef > 0 and batch.advantages is not None:
            raise ValueError(
                "This batch already has advantages, and reward_coef > 0 would change its rewards after them: the "
                "advantages would not see the KL shaping. Call ReferenceKL.apply(batch) before computing "
                "advantages (see docs/kl.md), or use reward_coef=0 (KL in the loss, via beta)."
            )
        out = self(batch)
        return dataclasses.replace(
            batch,
            ref_logprobs=out.ref_logprobs.cpu().numpy().astype(np.float32),
            rewards=out.rewards.cpu().numpy().astype(np.float32),
        )

    def __repr__(self) -> str:
        return f"ReferenceKL(model={type(self.model).__name__}, config={self.config})"
