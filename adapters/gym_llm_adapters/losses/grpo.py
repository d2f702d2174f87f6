"""GRPO policy loss: token-level clipped importance ratio, optional KL to a reference, engine-mismatch correction.

Per policy token ``t`` of sequence ``i`` (all tensors ``(B, S)`` and aligned as in :mod:`gym_llm_adapters.types`)::

    ratio_t   = exp(logp_t - old_logp_t)                           # "token" level
              = exp(mean_{t' in i}(logp_t' - old_logp_t'))          # "sequence" level (GSPO)
    surr_t    = -min(min(ratio_t, delta) * A_i, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A_i)
    surr_t   *= w_t                                                 # engine/trainer importance weight (TIS)
    kl_t      = k3(logp_t, ref_logp_t) = exp(ref_logp_t - logp_t) - (ref_logp_t - logp_t) - 1
    kl_t     *= ratio_t                                             # if kl_importance_correction
                                                                    # (k1 needs it, k2 refuses it: see the
                                                                    # kl_importance_correction table)
    loss_t    = surr_t + beta * kl_t
    loss      = aggregate(loss_t over policy tokens)                # token_mean | sequence_mean | dr_grpo

``logp`` is the trainer's current log-prob (with gradient), ``old_logp`` the trainer's log-prob under the
policy that sampled (no gradient; on-policy it is ``logp.detach()``), ``A_i`` the group-normalised advantage.
Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
training") corrects for the engine (vLLM) and the trainer computing slightly different probabilities for the
same weights: ``w_t = min(exp(old_logp_t - engine_logp_t), C_max)`` and variants (see
:class:`GRPOLossConfig.importance_sampling`).

References: Shao et al. 2024 (DeepSeekMath, GRPO); Yu et al. 2025 (DAPO: clip-higher, token-mean);
Liu et al. 2025 (Dr. GRPO); Zheng et al. 2025 (GSPO); DeepSeek-V3.2 2025 (KL importance correction);
Prime Intellect 2025 (INTELLECT-2, ``delta``). Semantics match TRL 1.16's ``GRPOTrainer._compute_loss``
option for option (docs/losses.md has the mapping; tests/adapters/losses/test_grpo_trl.py checks equality).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from gym_llm_adapters.kl import KLEstimator, kl_estimate
from gym_llm_adapters.losses._common import AGGREGATIONS, Aggregation, aggregate, check_token_tensor, masked_mean
from gym_llm_adapters.types import RolloutBatch

__all__ = ["ImportanceSampling", "GRPOLossConfig", "GRPOLossOutput", "GRPOLoss", "importance_sampling_weights"]

ImportanceSampling = Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
_IS_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
StaleTokens = Literal["behaviour_ratio", "mask", "ignore"]
_STALE_MODES = ("behaviour_ratio", "mask", "ignore")


KL_REFUSED = {
    ("k1", False): "has expected gradient 0 (E[grad log pi] = 0): the penalty would only add noise",
    ("k2", True): "optimises E[k1 + k2], not the KL: its gradient is not the reverse-KL gradient",
}
"""(estimator, kl_importance_correction) pairs refused with ``beta > 0``, and why."""


@dataclass(frozen=True, kw_only=True)
class GRPOLossConfig:
    """Settings of :class:`GRPOLoss` (TRL ``GRPOConfig`` names in brackets).

    Attributes:
        epsilon: lower clip range, the ratio is clipped below at ``1 - epsilon`` [``epsilon``]. Must be in
            ``[0, 1)``.
        epsilon_high: upper clip range, clipped above at ``1 + epsilon_high``; None means ``epsilon``
            (symmetric PPO clipping). DAPO's clip-higher uses 0.28 [``epsilon_high``]. Must be >= 0.
        delta: if set, the unclipped branch's ratio is also capped at ``delta`` (two-sided clipping of
            INTELLECT-2), bounding the update when advantages are negative and the ratio explodes; must be
            > ``1 + epsilon_high`` [``delta``].
        ratio_level: ``"token"`` (one ratio per token, GRPO/DAPO) or ``"sequence"`` (the exponentiated mean
            per-token log-ratio of the sequence, GSPO) [``importance_sampling_level``].
        beta: weight of the per-token KL to the reference model; 0 disables it and ``ref_logprobs`` is not
            needed [``beta``]. Must be >= 0.
        kl_estimator: estimator of the KL term (:func:`gym_llm_adapters.kl.kl_estimate`); GRPO and TRL use
            ``"k3"``, the only one TRL offers.
        kl_importance_correction: multiply the KL term by the (differentiable) policy ratio (DeepSeek-V3.2).
            Changes the KL gradient (not its value) even on-policy. What the expected gradient of ``beta * kl``
            then is, for tokens sampled from the old policy (exact by enumeration in
            ``tests/adapters/losses/test_kl_gradients.py``):

            ============  ===========================================  =========================================
            estimator     with the correction                          without
            ============  ===========================================  =========================================
            ``"k1"``      reverse-KL gradient (on- and off-policy)     **refused**: expected gradient 0
            ``"k2"``      **refused**: gradient of ``E[k1 + k2]``      reverse-KL gradient (on-policy only)
            ``"k3"``      reverse-KL gradient (on- and off-policy)     forward-KL gradient ``KL(ref || pi)``
                          (default; TRL ``use_bias_correction_kl``)    (GRPO paper; TRL's other setting)
            ============  ===========================================  =========================================

            Only used with ``beta > 0``.
        aggregation: how per-token losses become a scalar: ``"token_mean"`` (every policy token weighs the
            same; TRL ``"bnpo"``, and ``"dapo"`` with ``num_items``), ``"sequence_mean"`` (every sequence
            weighs the same; TRL ``"grpo"``), ``"dr_grpo"`` (sum over tokens / ``(B * max_completion_length)``;
            TRL ``"dr_grpo"``) [``loss_type``].
        max_completion_length: the Dr. GRPO constant: the most policy tokens one *row* (episode) can hold —
            for a multi-turn episode all its turns together (e.g. ``min(max_turns * max_new_tokens,
            max_seq_len)``), not one turn's budget; required when ``aggregation == "dr_grpo"``, ignored
            otherwise [``max_completion_length``; single-turn TRL rows are one turn]. Must be >= 1.
        importance_sampling: correction for engine/trainer log-prob mismatch, from
            ``d_t = old_logp_t - engine_logp_t`` on policy tokens
            [``vllm_importance_sampling_correction`` + ``vllm_importance_sampling_mode``]:
            ``"none"`` (no correction; ``engine_logprobs`` not needed), ``"token_truncate"`` (TIS:
            ``w_t = clip(exp(d_t), C_min, C_max)``), ``"token_mask"`` (``w_t = exp(d_t)``, 0 outside
            ``[C_min, C_max]``), ``"sequence_truncate"`` / ``"sequence_mask"`` (the same on
            ``exp(sum_t d_t)``, one weight per sequence). The weight multiplies the surrogate, not the KL term.
        importance_sampling_clip_min: ``C_min``; None means no lower bound
            [``vllm_importance_sampling_clip_min``].
        importance_sampling_clip_max: ``C_max`` (default 3.0, TRL's); None means no upper bound
            [``vllm_importance_sampling_clip_max``]. Truncate modes need at least one bound.
        stale_tokens: what to do with *stale* policy tokens — sampled by an older policy version than the one
            being trained (``token_versions < current_version``: the early turns of a multi-turn episode that
            ran across a weight update, or any asynchronous rollout). ``"behaviour_ratio"`` (default): their
            ratio is taken against the policy that sampled them, ``ratio_t = exp(logp_t - engine_logp_t)``,
            clipped like any ratio (PPO's off-policy correction; the engine's log-probs are the behaviour
            policy's, so the engine/trainer weight of those tokens is 1); ``"mask"``: they leave the loss;
            ``"ignore"``: treated as on-policy (biased; the behaviour before this option existed). Needs the
            engine log-probs and token versions (``from_batch`` reads them); without them nothing is stale.
        mask_truncated: episodes that were cut (length or turn limit) leave the loss entirely — their reward
            says nothing about a finished answer [TRL ``mask_truncated_completions``].
    """

    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    ratio_level: Literal["token", "sequence"] = "token"
    beta: float = 0.0
    kl_estimator: KLEstimator = "k3"
    kl_importance_correction: bool = True
    aggregation: Aggregation = "token_mean"
    max_completion_length: int | None = None
    importance_sampling: ImportanceSampling = "none"
    importance_sampling_clip_min: float | None = None
    importance_sampling_clip_max: float | None = 3.0
    stale_tokens: StaleTokens = "behaviour_ratio"
    mask_truncated: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.epsilon < 1:
            raise ValueError(f"epsilon must be in [0, 1); got {self.epsilon}.")
        if self.epsilon_high is not None and not self.epsilon_high >= 0:
            raise ValueError(f"epsilon_high must be >= 0 or None; got {self.epsilon_high}.")
        if self.delta is not None and not self.delta > 1 + self.eps_high:
            raise ValueError(f"delta must be > 1 + epsilon_high = {1 + self.eps_high}; got {self.delta}.")
        if self.ratio_level not in ("token", "sequence"):
            raise ValueError(f"ratio_level must be 'token' or 'sequence'; got {self.ratio_level!r}.")
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0; got {self.beta}.")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"kl_estimator must be 'k1', 'k2' or 'k3'; got {self.kl_estimator!r}.")
        if self.beta > 0 and (self.kl_estimator, self.kl_importance_correction) in KL_REFUSED:
            raise ValueError(
                f"kl_estimator={self.kl_estimator!r} with kl_importance_correction={self.kl_importance_correction} "
                f"{KL_REFUSED[(self.kl_estimator, self.kl_importance_correction)]}. The combinations whose gradient "
                "is the reverse-KL gradient are k1 with the correction, k3 with the correction (default; exact "
                "off-policy too) and k2 without it (on-policy); k3 without it is the forward-KL gradient (GRPO "
                "paper, TRL without use_bias_correction_kl)."
            )
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}; got {self.aggregation!r}.")
        if self.aggregation == "dr_grpo" and (self.max_completion_length is None or self.max_completion_length < 1):
            raise ValueError(
                "aggregation='dr_grpo' divides by B * max_completion_length: set max_completion_length >= 1 "
                f"(the generation budget); got {self.max_completion_length}."
            )
        self._check_importance_sampling()
        if self.stale_tokens not in _STALE_MODES:
            raise ValueError(f"stale_tokens must be one of {_STALE_MODES}; got {self.stale_tokens!r}.")

    def _check_importance_sampling(self) -> None:
        mode, lo, hi = self.importance_sampling, self.importance_sampling_clip_min, self.importance_sampling_clip_max
        if mode not in _IS_MODES:
            raise ValueError(f"importance_sampling must be one of {_IS_MODES}; got {mode!r}.")
        if mode.endswith("_truncate") and lo is None and hi is None:
            raise ValueError(f"importance_sampling={mode!r} needs importance_sampling_clip_min or _clip_max set.")
        if lo is not None and hi is not None and not lo < hi:
            raise ValueError(f"importance_sampling_clip_min ({lo}) must be < importance_sampling_clip_max ({hi}).")
        if lo is not None and lo < 0:
            raise ValueError(f"importance_sampling_clip_min must be >= 0; got {lo}.")

    @property
    def eps_high(self) -> float:
        """The effective upper clip range (``epsilon_high``, or ``epsilon`` when unset)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


def importance_sampling_weights(
    old_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: ImportanceSampling,
    *,
    clip_min: float | None = None,
    clip_max: float | None = None,
) -> torch.Tensor:
    """Engine-to-trainer importance weights ``pi_trainer / pi_engine`` for tokens the engine sampled.

    Args:
        old_logprobs: ``(B, S)`` the trainer's log-probs of the sampled tokens (no gradient).
        engine_logprobs: ``(B, S)`` the engine's log-probs of the same tokens (NaN = unknown: weight 1).
        mask: ``(B, S)`` bool, the policy tokens.
        mode: see :attr:`GRPOLossConfig.importance_sampling` (``"none"`` returns ones).
        clip_min / clip_max: ``C_min`` / ``C_max``; None = unbounded on that side.

    Returns:
        ``(B, S)`` for token modes, ``(B, 1)`` for sequence modes; 1.0 off the mask for token modes. No gradient.
    """
    if mode not in _IS_MODES:
        raise ValueError(f"mode must be one of {_IS_MODES}; got {mode!r}.")
    with torch.no_grad():
        if mode == "none":
            return torch.ones_like(old_logprobs)
        diff = torch.nan_to_num((old_logprobs - engine_logprobs) * mask, nan=0.0)  # (B, S)
        if mode.startswith("sequence"):
            diff = diff.sum(-1, keepdim=True)  # (B, 1)
        weights = diff.exp()
        if mode.endswith("_truncate"):
            return weights.clamp(min=clip_min, max=clip_max)
        low = -torch.inf if clip_min is None else clip_min
        high = torch.inf if clip_max is None else clip_max
        return weights.masked_fill((weights < low) | (weights > high), 0.0)


@dataclass(frozen=True)
class GRPOLossOutput:
    """The loss and detached diagnostics (0-dim tensors; :meth:`metrics` turns them into floats).

    Attributes:
        loss: the scalar to ``backward()``.
        policy_loss: the aggregated surrogate term alone (detached).
        kl: masked token-mean of the per-token KL term before ``beta`` (None when ``beta == 0``).
        clip_low_fraction: fraction of policy tokens with ``ratio < 1 - epsilon`` and a negative advantage
            (the gradient is zeroed there).
        clip_high_fraction: fraction with ``ratio > 1 + epsilon_high`` and a positive advantage.
        ratio_mean: masked token-mean of the policy ratio.
        is_weight_mean / is_weight_min / is_weight_max: importance-weight stats over policy tokens (None when
            ``importance_sampling == "none"``).
        stale_fraction: fraction of the policy tokens (before any masking) that were stale (None when no
            ``stale_mask`` was given).
    """

    loss: torch.Tensor
    policy_loss: torch.Tensor
    kl: torch.Tensor | None
    clip_low_fraction: torch.Tensor
    clip_high_fraction: torch.Tensor
    ratio_mean: torch.Tensor
    is_weight_mean: torch.Tensor | None = None
    is_weight_min: torch.Tensor | None = None
    is_weight_max: torch.Tensor | None = None
    stale_fraction: torch.Tensor | None = None

    def metrics(self, prefix: str = "grpo/") -> dict[str, float]:
        """Namespaced float metrics to log (one device sync per entry)."""
        out = {}
        for name in ("loss", "policy_loss", "kl", "clip_low_fraction", "clip_high_fraction", "ratio_mean",
                     "is_weight_mean", "is_weight_min", "is_weight_max", "stale_fraction"):
            value = getattr(self, name)
            if value is not None:
                out[prefix + name] = float(value.detach())
        return out


class GRPOLoss:
    """The GRPO / DAPO / Dr. GRPO / GSPO policy loss over per-token log-probs (module docstring: formula).

    Args:
        config: a :class:`GRPOLossConfig`; defaults to ``GRPOLossConfig()`` (eps 0.2, no KL, token mean).

    Call it with the trainer's log-probs (for instance from :func:`gym_llm_adapters.logprobs.token_logprobs`)
    and either tensors (:meth:`__call__`) or a :class:`RolloutBatch` whose ``advantages`` are set
    (:meth:`from_batch`).
    """

    def __init__(self, config: GRPOLossConfig | None = None) -> None:
        self.config = config if config is not None else GRPOLossConfig()

    def __repr__(self) -> str:
        return f"GRPOLoss({self.config})"

    def _check(self, logprobs: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
               old_logprobs: torch.Tensor | None, engine_logprobs: torch.Tensor | None,
               ref_logprobs: torch.Tensor | None) -> None:
        if not isinstance(logprobs, torch.Tensor) or logprobs.dim() != 2:
            raise ValueError(f"logprobs must be a (B, S) tensor; got {getattr(logprobs, 'shape', type(logprobs))}.")
        shape = logprobs.shape
        check_token_tensor("mask", mask, shape)
        check_token_tensor("old_logprobs", old_logprobs, shape, required=False)
        check_token_tensor("engine_logprobs", engine_logprobs, shape,
                           required=self.config.importance_sampling != "none")
        check_token_tensor("ref_logprobs", ref_logprobs, shape, required=self.config.beta > 0)
        if not isinstance(advantages, torch.Tensor) or tuple(advantages.shape) not in ((shape[0],), tuple(shape)):
            raise ValueError(
                f"advantages must be a tensor of shape ({shape[0]},) or {tuple(shape)}; "
                f"got {getattr(advantages, 'shape', type(advantages))}."
            )

    def __call__(
        self,
        logprobs: torch.Tensor,
        *,
        mask: torch.Tensor,
        advantages: torch.Tensor,
        old_logprobs: torch.Tensor | None = None,
        engine_logprobs: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        num_items: float | torch.Tensor | None = None,
        stale_mask: torch.Tensor | None = None,
        truncated: torch.Tensor | None = None,
    ) -> GRPOLossOutput:
        """The loss for one (micro-)batch.

        Args:
            logprobs: ``(B, S)`` trainer log-probs of the sampled tokens, with gradient.
            mask: ``(B, S)`` 1 on policy tokens (the only positions that count).
            advantages: ``(B,)`` per sequence (broadcast to its tokens) or ``(B, S)`` per token.
            old_logprobs: ``(B, S)`` trainer log-probs under the sampling policy; None = ``logprobs.detach()``
                (one gradient step per batch, TRL's default). Pass the engine's log-probs here to use them as
                the behaviour policy without a trainer recompute.
            engine_logprobs: ``(B, S)`` the engine's log-probs (``RolloutBatch.logprobs``); needed when
                ``importance_sampling != "none"``.
            ref_logprobs: ``(B, S)`` reference log-probs; needed when ``beta > 0``.
            num_items: ``token_mean`` denominator override (policy tokens of the whole accumulated batch).
            stale_mask: ``(B, S)`` bool, policy tokens sampled by an older policy version than the one trained
                (see :attr:`GRPOLossConfig.stale_tokens`); None = none.
            truncated: ``(B,)`` bool, episodes that were cut (used with ``mask_truncated``).
        """
        cfg = self.config
        self._check(logprobs, mask, advantages, old_logprobs, engine_logprobs, ref_logprobs)
        mask = mask.bool()
        stats: dict[str, torch.Tensor | None] = {}
        if cfg.mask_truncated and truncated is not None:
            if tuple(truncated.shape) != (mask.shape[0],):
                raise ValueError(f"truncated must have shape ({mask.shape[0]},); got {tuple(truncated.shape)}.")
            mask = mask & ~truncated.bool().to(mask.device)[:, None]
        if old_logprobs is None:
            old_logprobs = logprobs.detach()
        if stale_mask is not None and cfg.stale_tokens != "ignore":
            check_token_tensor("stale_mask", stale_mask, logprobs.shape)
            stale = stale_mask.bool() & mask
            stats["stale_fraction"] = masked_mean(stale.float(), mask)
            if cfg.stale_tokens == "mask":
                mask = mask & ~stale
            elif bool(stale.any()):
                if engine_logprobs is None:
                    raise ValueError("stale_tokens='behaviour_ratio' needs engine_logprobs (the behaviour policy's "
                                     "log-probs of the stale tokens); pass them, or stale_tokens='mask'.")
                behaviour = torch.nan_to_num(engine_logprobs, nan=0.0)
                old_logprobs = torch.where(stale, behaviour, old_logprobs)
        adv = advantages.to(logprobs.dtype)
        adv = adv.unsqueeze(1) if adv.dim() == 1 else adv  # (B, 1) or (B, S)
        log_ratio = logprobs - old_logprobs  # (B, S)
        if cfg.ratio_level == "sequence":
            log_ratio = ((log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1))
        ratio = log_ratio.exp()  # (B, S) or (B, 1)
        clipped = ratio.clamp(1 - cfg.epsilon, 1 + cfg.eps_high)
        unclipped = ratio if cfg.delta is None else ratio.clamp(max=cfg.delta)
        per_token = -torch.min(unclipped * adv, clipped * adv)
        if cfg.importance_sampling != "none":
            weights = importance_sampling_weights(
                old_logprobs, engine_logprobs, mask, cfg.importance_sampling,
                clip_min=cfg.importance_sampling_clip_min, clip_max=cfg.importance_sampling_clip_max)
            per_token = per_token * weights
            stats.update(self._weight_stats(weights, mask))
        per_token = per_token.expand(mask.shape)
        policy_loss = aggregate(per_token, mask, cfg.aggregation,
                                max_completion_length=cfg.max_completion_length, num_items=num_items)
        loss, kl_mean = policy_loss, None
        if cfg.beta > 0:
            kl = kl_estimate(logprobs, ref_logprobs, cfg.kl_estimator)  # (B, S)
            if cfg.kl_importance_correction:
                kl = kl * ratio
            loss = aggregate(per_token + cfg.beta * kl, mask, cfg.aggregation,
                             max_completion_length=cfg.max_completion_length, num_items=num_items)
            kl_mean = masked_mean(kl.detach(), mask)
        with torch.no_grad():
            full_ratio = ratio.expand(mask.shape)
            return GRPOLossOutput(
                loss=loss,
                policy_loss=policy_loss.detach(),
                kl=kl_mean,
                clip_low_fraction=masked_mean(((full_ratio < 1 - cfg.epsilon) & (adv < 0)).float(), mask),
                clip_high_fraction=masked_mean(((full_ratio > 1 + cfg.eps_high) & (adv > 0)).float(), mask),
                ratio_mean=masked_mean(full_ratio, mask),
                **stats,
            )

    @staticmethod
    def _weight_stats(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        if weights.shape[-1] == 1:  # one weight per sequence
            values = weights.squeeze(-1)[mask.any(-1)]
        else:
            values = weights[mask]
        if values.numel() == 0:
            values = weights.new_ones(1)
        return {"is_weight_mean": values.mean(), "is_weight_min": values.min(), "is_weight_max": values.max()}

    def counted_tokens(self, batch: RolloutBatch, *, current_version: int | None = None) -> int:
        """How many policy tokens of ``batch`` enter the loss (after ``mask_truncated`` and ``stale_tokens="mask"``):
        the ``num_items`` to pass to every micro-batch's :meth:`from_batch` for a ``token_mean`` over the batch."""
        mask = batch.policy_mask.astype(bool)
        if self.config.mask_truncated and batch.truncated is not None:
            mask = mask & ~batch.truncated.astype(bool)[:, None]
        if self.config.stale_tokens == "mask" and batch.token_versions is not None and mask.any():
            newest = int(batch.token_versions[batch.policy_mask.astype(bool)].max())
            mask = mask & ~(batch.token_versions < (newest if current_version is None else current_version))
        return int(mask.sum())

    def from_batch(
        self,
        logprobs: torch.Tensor,
        batch: RolloutBatch | Mapping[str, torch.Tensor],
        *,
        old_logprobs: torch.Tensor | None = None,
        num_items: float | torch.Tensor | None = None,
        current_version: int | None = None,
    ) -> GRPOLossOutput:
        """The loss for a :class:`RolloutBatch` (or its :meth:`RolloutBatch.to_torch` dict).

        Reads ``policy_mask`` (mask), ``advantages`` (must be set, e.g. by
        :class:`~gym_llm_adapters.losses.MCAdvantage`), ``logprobs`` (the engine's, for importance sampling and
        stale tokens), ``ref_logprobs`` (when ``beta > 0``, e.g. from :class:`~gym_llm_adapters.kl.ReferenceKL`),
        ``token_versions`` and ``truncated`` (when present).

        ``current_version`` is the policy version whose weights ``logprobs`` were computed with (the engine's
        ``version`` since the last weight push); policy tokens with an older ``token_versions`` are stale. None:
        the newest version in the batch.
        """
        tensors = batch.to_torch(logprobs.device) if isinstance(batch, RolloutBatch) else dict(batch)
        if tensors.get("advantages") is None:
            raise ValueError("batch.advantages is None: compute them first, e.g. batch = MCAdvantage()(batch).")
        if self.config.beta > 0 and tensors.get("ref_logprobs") is None:
            raise ValueError("beta > 0 needs batch.ref_logprobs: run ReferenceKL(ref_model).apply(batch) first.")
        stale_mask = None
        versions = tensors.get("token_versions")
        if versions is not None:
            versions = versions.to(logprobs.device)
            policy = tensors["policy_mask"].to(logprobs.device).bool()
            if current_version is None:
                current_version = int(versions[policy].max()) if bool(policy.any()) else 0
            stale_mask = policy & (versions < current_version)
        truncated = tensors.get("truncated")
        return self(
            logprobs,
            stale_mask=stale_mask,
            truncated=None if truncated is None else truncated.to(logprobs.device),
            mask=tensors["policy_mask"].to(logprobs.device),
            advantages=tensors["advantages"].to(logprobs.device),
            old_logprobs=old_logprobs,
            engine_logprobs=tensors["logprobs"].to(logprobs.device),
            ref_logprobs=None if tensors.get("ref_logprobs") is None else tensors["ref_logprobs"].to(logprobs.device),
            num_items=num_items,
        )
