"""TRL integration: gym_llm envs as prompt datasets, reward functions, a ``rollout_func``, and SFT data.

* :func:`env_dataset` — a ``datasets.Dataset`` of an env's prompts with ``task_id``/``answer``/``seed`` columns;
* :class:`GSM8KReward`, :class:`IFEvalReward`, :class:`ScorerReward`, :class:`EnvReward`, :func:`env_reward` —
  reward functions with TRL's signature, built from the env scorers;
* :class:`EnvRolloutFunc` — ``GRPOTrainer(rollout_func=...)`` running a gym_llm vector env (multi-turn, tools)
  with the trainer's generation (its vLLM, or its model), token-exact, with an ``env_mask`` over env tokens;
* :func:`environment_factory`, :func:`environment_reward` — ``GRPOTrainer(environment_factory=...)``: a gym_llm tool
  env as a TRL environment class (its tools as methods, ``reset(**row)``), scored by the env itself;
* :func:`sft_dataset` — collected rollouts (top-k / reward threshold) as ``SFTTrainer`` data;
* :func:`install_vllm_weight_sync` — TRL's colocated vLLM weight sync made right on vLLM-CPU on every CPU (see
  :mod:`gym_llm_adapters.trl.vllm_sync`); importing this package installs it.

See ``docs/trl.md``. TRL itself is imported only when a trainer-facing function runs.
"""

from gym_llm_adapters.trl.dataset import env_dataset
from gym_llm_adapters.trl.environment import (EnvironmentFactory, GymLLMEnvironment, add_response_template,
                                              environment_factory, environment_reward)
from gym_llm_adapters.trl.generation import StepVersionedEngine, sampling_from_trainer, trainer_engine
from gym_llm_adapters.trl.rewards import EnvReward, GSM8KReward, IFEvalReward, ScorerReward, completion_text, env_reward
from gym_llm_adapters.trl.rollout import EnvRolloutFunc, PromptIndex, trl_fields
from gym_llm_adapters.trl.sft import select_rollouts, sft_dataset, sft_rows
from gym_llm_adapters.trl.vllm_sync import install_vllm_weight_sync

install_vllm_weight_sync()  # patches TRL's VLLMGeneration when TRL defines it (nothing is imported now)

__all__ = [
    "env_dataset",
    "GSM8KReward",
    "IFEvalReward",
    "ScorerReward",
    "EnvReward",
    "env_reward",
    "completion_text",
    "EnvRolloutFunc",
    "PromptIndex",
    "trl_fields",
    "environment_factory",
    "environment_reward",
    "EnvironmentFactory",
    "GymLLMEnvironment",
    "add_response_template",
    "trainer_engine",
    "sampling_from_trainer",
    "StepVersionedEngine",
    "select_rollouts",
    "sft_dataset",
    "sft_rows",
    "install_vllm_weight_sync",
]
