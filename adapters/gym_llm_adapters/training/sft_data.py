"""Supervised data for the built-in loop, as token-exact :class:`~gym_llm_adapters.types.Trajectory` s.

* :func:`reference_trajectories` — the env's own tasks with their worked solutions as the assistant turn
  (GSM8K's ``answer`` field, the arithmetic source's, or a record's ``response``/``completion``/
  ``solution``). The reply is *stepped through the env* in tokens mode, so the sequence is exactly the
  rendered prompt + the reply's ids + the template's turn closing, and the env scores it (a reference the
  env does not reward is a data problem, and is logged).
* :func:`rollout_trajectories` — trajectories from a rollout file, optionally filtered by reward and
  top-k per group (rejection sampling / expert iteration).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import gymnasium as gym
import numpy as np

from gym_llm.core.spaces import unpack_tokens
from gym_llm.core.tasks import Task
from gym_llm_adapters.losses.selection import select_rollouts
from gym_llm_adapters.types import Trajectory

__all__ = ["REFERENCE_FIELDS", "SFTDataError", "reference_reply", "reference_trajectories", "rollout_trajectories",
           "warm_start_data"]

class SFTDataError(ValueError):
    """The warm start's data gives nothing to learn from: the user's settings, not a bug (``gym-llm train`` exits 2)."""


logger = logging.getLogger(__name__)

REFERENCE_FIELDS = ("response", "completion", "solution", "answer")
"""Record fields searched, in order, for a task's worked solution."""


def reference_reply(task: Task) -> str | None:
    """The worked solution stored with ``task`` (first non-empty string of :data:`REFERENCE_FIELDS`)."""
    data: Mapping[str, Any] = task.data if isinstance(task.data, Mapping) else {}
    for name in REFERENCE_FIELDS:
        value = data.get(name)
        if isinstance(value, str) and value.strip():
            return value
    return None


def reference_trajectories(env_id: str, env_kwargs: Mapping[str, Any], tokenizer: Any, *, max_seq_len: int,
                           max_new_tokens: int, max_examples: int | None = None) -> list[Trajectory]:
    """One single-turn trajectory per task of ``env_id``: its prompt and its worked solution.

    Args:
        env_id / env_kwargs: the env and its task source, as for training.
        tokenizer: the policy's tokenizer (encodes the replies; its eos closes each turn).
        max_seq_len / max_new_tokens: the env's token limits; replies longer than ``max_new_tokens`` are
            skipped (and counted in the log).
        max_examples: use at most this many tasks (the first ones of the source); None = all.

    Raises:
        ValueError: the env's tasks carry no worked solution (the message says what to use instead).
    """
    env = gym.make(env_id, mode="tokens", tokenizer=tokenizer, max_seq_len=max_seq_len,
                   max_action_tokens=max_new_tokens, **dict(env_kwargs))
    try:
        tasks = env.unwrapped.parts.tasks
        count = len(tasks) if max_examples is None else min(max_examples, len(tasks))
        eos = tokenizer.eos_token_id
        out: list[Trajectory] = []
        too_long = unrewarded = missing = 0
        for index in range(count):
            reply = reference_reply(tasks[index])
            if reply is None:
                missing += 1
                continue
            ids = list(tokenizer.encode(reply, add_special_tokens=False)) + ([eos] if eos is not None else [])
            if len(ids) > max_new_tokens:
                too_long += 1
                continue
            obs, _ = env.reset(options={"task_id": index})
            prompt = unpack_tokens(obs).astype(np.int64)
            _, reward, terminated, truncated, _ = env.step(np.asarray(ids, dtype=np.int64))
            unrewarded += reward <= 0
            token_ids = np.concatenate([prompt, np.asarray(ids, dtype=np.int64)])
            mask = np.zeros(len(token_ids), dtype=np.int8)
            mask[len(prompt):] = 1
            out.append(Trajectory(task_id=tasks[index].task_id, group_id=index, round=0, token_ids=token_ids,
                                  policy_mask=mask, logprobs=np.zeros(len(token_ids), dtype=np.float32),
                                  prompt_length=len(prompt), rewards=[float(reward)], versions=[0],
                                  terminated=bool(terminated), truncated=bool(truncated)))
    finally:
        env.close()
    if missing == count:
        raise SFTDataError(
            f"{env_id}'s tasks have no worked solutions (looked for the record fields {list(REFERENCE_FIELDS)}), "
            "so sft_data='references' has nothing to learn from. Collect rollouts first "
            "(gym-llm eval ... --out rollouts.jsonl) and pass that file as the SFT data, with --sft-min-reward."
        )
    if not out:
        raise SFTDataError(f"no usable reference replies: {too_long} are longer than max_new_tokens={max_new_tokens}; "
                         "raise max_new_tokens.")
    logger.info("SFT references: %d examples (%d without a solution, %d too long, %d not rewarded by the env)",
                len(out), missing, too_long, unrewarded)
    return out


def rollout_trajectories(path: str | Path, *, min_reward: float | None = None,
                         top_k: int | None = None) -> list[Trajectory]:
    """Trajectories from a rollout file, keeping the best ``top_k`` per group and ``reward >= min_reward``
    (:func:`~gym_llm_adapters.losses.select_rollouts`); an empty selection is an error."""
    trajectories = select_rollouts(path, top_k=top_k, min_reward=min_reward)
    if not trajectories:
        raise SFTDataError(f"no trajectory of {path} passes the selection (min_reward={min_reward}, top_k={top_k}).")
    return trajectories


def warm_start_data(config: Any, tokenizer: Any = None) -> list[Trajectory]:
    """The SFT phase's examples as a :class:`~gym_llm_adapters.training.config.TrainConfig` asks (``sft_data``:
    ``"references"`` or a rollout file). ``tokenizer`` None: the model folder's own, read without loading the model,
    so a fresh run refuses a warm start with nothing to learn (:class:`SFTDataError`) before any model or engine."""
    if config.sft_data != "references":
        return rollout_trajectories(config.sft_data, min_reward=config.sft_min_reward, top_k=config.sft_top_k)
    if tokenizer is None:
        from transformers import AutoTokenizer

        from gym_llm_adapters.models.resolve import resolve_model

        tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(config.model)), trust_remote_code=False)
    return reference_trajectories(config.env_id, config.env_kwargs, tokenizer, max_seq_len=config.max_seq_len,
                                  max_new_tokens=config.max_new_tokens, max_examples=config.sft_examples)
