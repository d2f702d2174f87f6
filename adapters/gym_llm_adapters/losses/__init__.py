"""Training losses over per-token log-probs laid out like :class:`gym_llm_adapters.types.RolloutBatch`.

* :class:`GRPOLoss` / :class:`GRPOLossConfig` — GRPO, DAPO, Dr. GRPO, GSPO variants, KL term, TIS.
* :class:`SFTLoss` / :class:`SFTLossConfig` — assistant-only NLL (or MinorSFT), optional KL to a reference.
* :class:`MCAdvantage` / :class:`AdvantageConfig` — group-relative Monte-Carlo advantages.
* :class:`GroupBuffer` — gathers complete groups from out-of-order episodes.
* :class:`TopKRewardSelector` / :func:`select_rollouts` — keeps the best k episodes of each group (and/or a reward
  threshold), from trajectories or a rollout file.
"""

from gym_llm_adapters.episodes import GroupBuffer  # one implementation, shared with the collector
from gym_llm_adapters.losses._common import Aggregation, aggregate
from gym_llm_adapters.losses.advantages import (
    AdvantageConfig,
    MCAdvantage,
    group_advantages,
    group_keys,
    select_rows,
)
from gym_llm_adapters.losses.grpo import (
    GRPOLoss,
    GRPOLossConfig,
    GRPOLossOutput,
    ImportanceSampling,
    importance_sampling_weights,
)
from gym_llm_adapters.losses.selection import TopKRewardSelector, select_rollouts
from gym_llm_adapters.losses.sft import SFTLoss, SFTLossConfig, SFTLossOutput

__all__ = [
    "Aggregation",
    "aggregate",
    "AdvantageConfig",
    "GroupBuffer",
    "MCAdvantage",
    "group_advantages",
    "group_keys",
    "select_rows",
    "GRPOLoss",
    "GRPOLossConfig",
    "GRPOLossOutput",
    "ImportanceSampling",
    "importance_sampling_weights",
    "TopKRewardSelector",
    "select_rollouts",
    "SFTLoss",
    "SFTLossConfig",
    "SFTLossOutput",
]
