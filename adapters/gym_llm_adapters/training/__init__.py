"""The built-in training loop behind ``gym-llm train``: GRPO (with an optional SFT warm start) and SFT.

* :class:`TrainConfig` — every setting, documented; :class:`Trainer` — runs it (resumable, Ctrl-C safe).
* :class:`Evaluator` / :class:`EvalSummary` — fixed-task evaluation with an engine.
* :class:`MetricsLogger`, :func:`plot_training_curves`, :func:`plot_reward_histogram` — metrics and plots.
* :func:`reference_trajectories` / :func:`rollout_trajectories` — supervised data as trajectories.
"""

from gym_llm_adapters.training.config import TrainConfig
from gym_llm_adapters.training.evaluation import EvalSummary, Evaluator, summarize
from gym_llm_adapters.training.metrics import MetricsLogger, plot_reward_histogram, plot_training_curves
from gym_llm_adapters.training.sft_data import reference_trajectories, rollout_trajectories
from gym_llm_adapters.training.trainer import Trainer, TrainResult

__all__ = ["TrainConfig", "Trainer", "TrainResult", "Evaluator", "EvalSummary", "summarize", "MetricsLogger",
           "plot_training_curves", "plot_reward_histogram", "reference_trajectories", "rollout_trajectories"]
