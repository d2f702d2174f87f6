"""Supervised fine-tuning loss on assistant tokens only, with an optional KL pull towards a reference model.

Per assistant token ``t`` (``mask == 1``; prompt, user, tool and env tokens never count)::

    nll_t  = -logp_t                                             # objective = "nll"
    nll_t  = -log sigmoid(minor_beta * (logp_t - ref_logp_t))    # objective = "minor_sft" (Xie et al. 2024)
    kl_t   = k(logp_t, ref_logp_t)                               # k1 | k2 | k3, see gym_llm_adapters.kl
    loss   = aggregate(nll_t) + kl_coef * aggregate(kl_t)        # token_mean (default) or sequence_mean

With ``kl_coef == 0`` and ``objective == "nll"`` the reference log-probs are not needed. The tokens come from
a dataset, not from the policy, so the KL term here is a regulariser evaluated on data tokens (as in TorchRL's
``SFTLoss``), not an unbiased KL estimate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from gym_llm_adapters.kl import KLEstimator, kl_estimate
from gym_llm_adapters.losses._common import aggregate, check_token_tensor
from gym_llm_adapters.types import RolloutBatch

__all__ = ["SFTLossConfig", "SFTLossOutput", "SFTLoss"]


@dataclass(frozen=True, kw_only=True)
class SFTLossConfig:
    """Settings of :class:`SFTLoss`.

    Attributes:
        objective: ``"nll"`` (negative log-likelihood, plain SFT) or ``"minor_sft"``
            (``-log sigmoid(minor_beta * (logp - ref_logp))``, which needs ``ref_logprobs`` and keeps the model
            near the reference implicitly).
        minor_beta: the sigmoid's scale for ``"minor_sft"``; ignored otherwise. Must be > 0.
        aggregation: ``"token_mean"`` (mean over all assistant tokens of the batch; long answers weigh more)
            or ``"sequence_mean"`` (mean over each sequence's tokens, then over sequences).
        kl_coef: weight of the KL-to-reference term; 0 (default) disables it. Must be >= 0.
        kl_estimator: ``"k2"`` or ``"k3"`` (default; non-negative, as TorchRL's SFT KL). Both pull towards the
            reference on the dataset's tokens; ``"k1"`` is refused with ``kl_coef > 0`` (its gradient ignores the
            reference).
    """

    objective: Literal["nll", "minor_sft"] = "nll"
    minor_beta: float = 0.1
    aggregation: Literal["token_mean", "sequence_mean"] = "token_mean"
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"

    def __post_init__(self) -> None:
        if self.objective not in ("nll", "minor_sft"):
            raise ValueError(f"objective must be 'nll' or 'minor_sft'; got {self.objective!r}.")
        if not self.minor_beta > 0:
            raise ValueError(f"minor_beta must be > 0; got {self.minor_beta}.")
        if self.aggregation not in ("token_mean", "sequence_mean"):
            raise ValueError(f"aggregation must be 'token_mean' or 'sequence_mean'; got {self.aggregation!r}.")
        if not self.kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0; got {self.kl_coef}.")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"kl_estimator must be 'k1', 'k2' or 'k3'; got {self.kl_estimator!r}.")
        if self.kl_coef > 0 and self.kl_estimator == "k1":
            raise ValueError(
                "kl_estimator='k1' cannot regularise SFT: on dataset tokens its gradient is kl_coef * grad log p, "
                "which ignores the reference (it only rescales the NLL, and unlearns at kl_coef >= 1). Use 'k2' "
                "(gradient (log p - log ref) * grad log p) or 'k3' (default; (1 - ref/p) * grad log p)."
            )

    @property
    def needs_reference(self) -> bool:
        """Whether ``ref_logprobs`` must be passed."""
        return self.kl_coef > 0 or self.objective == "minor_sft"


@dataclass(frozen=True)
class SFTLossOutput:
    """The loss and its parts.

    Attributes:
        loss: the scalar to ``backward()``.
        nll: the aggregated objective term (detached).
        kl: the aggregated KL term before ``kl_coef`` (detached), None when ``kl_coef == 0``.
        num_tokens: assistant tokens in the batch.
    """

    loss: torch.Tensor
    nll: torch.Tensor
    kl: torch.Tensor | None
    num_tokens: int

    def metrics(self, prefix: str = "sft/") -> dict[str, float]:
        out = {prefix + "loss": float(self.loss.detach()), prefix + "nll": float(self.nll),
               prefix + "num_tokens": float(self.num_tokens)}
        if self.kl is not None:
            out[prefix + "kl"] = float(self.kl)
        return out


class SFTLoss:
    """Assistant-only SFT loss over per-token log-probs (module docstring: formula).

    Args:
        config: a :class:`SFTLossConfig`; defaults to plain NLL, token mean, no KL.
    """

    def __init__(self, config: SFTLossConfig | None = None) -> None:
        self.config = config if config is not None else SFTLossConfig()

    def __repr__(self) -> str:
        return f"SFTLoss({self.config})"

    def __call__(
        self,
        logprobs: torch.Tensor,
        *,
        mask: torch.Tensor,
        ref_logprobs: torch.Tensor | None = None,
        num_items: float | torch.Tensor | None = None,
    ) -> SFTLossOutput:
        """The loss for one (micro-)batch.

        Args:
            logprobs: ``(B, S)`` the model's log-probs of the target tokens, with gradient.
            mask: ``(B, S)`` 1 on assistant tokens.
            ref_logprobs: ``(B, S)`` reference log-probs; needed when ``kl_coef > 0`` or ``objective ==
                "minor_sft"``.
            num_items: ``token_mean`` denominator override (assistant tokens of the whole accumulated batch).
        """
        cfg = self.config
        if not isinstance(logprobs, torch.Tensor) or logprobs.dim() != 2:
            raise ValueError(f"logprobs must be a (B, S) tensor; got {getattr(logprobs, 'shape', type(logprobs))}.")
        check_token_tensor("mask", mask, logprobs.shape)
        check_token_tensor("ref_logprobs", ref_logprobs, logprobs.shape, required=cfg.needs_reference)
        mask = mask.bool()
        if cfg.objective == "nll":
            per_token = -logprobs
        else:
            per_token = -F.logsigmoid(cfg.minor_beta * (logprobs - ref_logprobs))
        nll = aggregate(per_token, mask, cfg.aggregation, num_items=num_items)
        loss, kl = nll, None
        if cfg.kl_coef > 0:
            kl = aggregate(kl_estimate(logprobs, ref_logprobs, cfg.kl_estimator), mask, cfg.aggregation,
                           num_items=num_items)
            loss = nll + cfg.kl_coef * kl
            kl = kl.detach()
        return SFTLossOutput(loss=loss, nll=nll.detach(), kl=kl, num_tokens=int(mask.sum()))

    def from_batch(self, logprobs: torch.Tensor, batch: RolloutBatch | Mapping[str, torch.Tensor], *,
                   num_items: float | torch.Tensor | None = None) -> SFTLossOutput:
        """The loss for a :class:`RolloutBatch` (``policy_mask`` = assistant tokens, ``ref_logprobs`` if needed)."""
        tensors = batch.to_torch(logprobs.device) if isinstance(batch, RolloutBatch) else dict(batch)
        ref = tensors.get("ref_logprobs")
        if self.config.needs_reference and ref is None:
            raise ValueError("this SFTLoss needs batch.ref_logprobs: run ReferenceKL(ref_model).apply(batch) first.")
        return self(logprobs, mask=tensors["policy_mask"].to(logprobs.device),
                    ref_logprobs=None if ref is None else ref.to(logprobs.device), num_items=num_items)
