"""Shared pieces of the losses: input checks and masked aggregation of per-token losses."""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["Aggregation", "AGGREGATIONS", "aggregate", "check_token_tensor", "masked_mean"]

Aggregation = Literal["token_mean", "sequence_mean", "dr_grpo"]
AGGREGATIONS = ("token_mean", "sequence_mean", "dr_grpo")


def check_token_tensor(name: str, value: torch.Tensor | None, shape: torch.Size, *, required: bool = True) -> None:
    """Raise a clear error unless ``value`` is a tensor of ``shape`` (or None when not ``required``)."""
    if value is None:
        if required:
            raise ValueError(f"{name} is required here; got None.")
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {tuple(shape)}; got {type(value).__name__}.")
    if value.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)} (the log-probs' shape); got {tuple(value.shape)}.")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is true (0 when the mask is empty); a scalar."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation,
    *,
    max_completion_length: int | None = None,
    num_items: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a ``(B, S)`` per-token loss to a scalar over the ``(B, S)`` bool ``mask``.

    * ``"token_mean"``: ``sum(l * m) / sum(m)`` — every policy token weighs the same (DAPO). With ``num_items``
      the denominator is ``num_items`` instead: pass the policy-token count of the whole batch when it is split
      into micro-batches for gradient accumulation, so the accumulated gradient equals the full-batch one.
    * ``"sequence_mean"``: ``mean_b(sum_t(l * m) / sum_t(m))`` — every sequence weighs the same (GRPO paper).
    * ``"dr_grpo"``: ``sum(l * m) / (B * max_completion_length)`` — a constant denominator (Dr. GRPO).
    """
    masked = per_token * mask
    if aggregation == "token_mean":
        denominator = mask.sum().clamp(min=1) if num_items is None else num_items
        return masked.sum() / denominator
    if aggregation == "sequence_mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if aggregation == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("aggregation='dr_grpo' needs max_completion_length; got None.")
        return masked.sum() / (per_token.shape[0] * max_completion_length)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}; got {aggregation!r}.")
