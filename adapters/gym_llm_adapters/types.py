"""Typed records that cross module boundaries in the adapters: engine completions, collected steps,
episodes (trajectories) and padded training batches.

Conventions (all modules follow them):

* Token-aligned arrays have one entry per token of the sequence they describe. A log-prob at position
  ``t`` is ``log p(token_t | tokens_<t)``; positions the policy did not sample hold 0.0.
* ``policy_mask`` (a.k.a. assistant mask) is 1 where the policy sampled the token, 0 for prompt and
  env/tool tokens. Losses and KL only ever look at positions where it is 1.
* ``version`` is the engine's integer policy version at the time it generated the tokens.
* Arrays are numpy in records (cheap to write to disk, no torch needed); :meth:`RolloutBatch.to_torch`
  gives tensors for training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

__all__ = ["Completion", "StepRecord", "Trajectory", "RolloutBatch"]


@dataclass(frozen=True, slots=True)
class Completion:
    """One sampled continuation of a prompt.

    Attributes:
        prompt_ids: ``(P,)`` int64, the prompt the engine conditioned on.
        token_ids: ``(T,)`` int64, the sampled tokens (eos included when generation stopped on it).
        logprobs: ``(T,)`` float32, log-prob of every sampled token under the engine's policy (first
            token included), before temperature/top-p processing unless the engine says otherwise.
        text: the decoded completion.
        finish_reason: ``"stop"`` (eos or a stop condition) or ``"length"``.
        version: the engine's policy version that produced it.
    """

    prompt_ids: np.ndarray
    token_ids: np.ndarray
    logprobs: np.ndarray
    text: str
    finish_reason: str
    version: int


@dataclass(slots=True)
class StepRecord:
    """One env step of one sub-env, as the collector saw it.

    Attributes:
        env_index: which sub-env of the vector env.
        task_id / group_id / round / turn: from the env's info (``turn`` is 1-based after the step).
        prompt_ids: ``(P,)`` the observation tokens the policy conditioned on.
        completion_ids: ``(T,)`` the sampled tokens (the action).
        logprobs: ``(T,)`` float32 engine log-probs of ``completion_ids``.
        reward / terminated / truncated: the env's step result.
        version: the engine version that generated ``completion_ids``.
        prompt_text / completion_text: decoded text of both.
        finish_reason: the engine's finish reason.
        info: the sub-env's step info (scalars and strings only; per-token arrays are dropped).
        env_id: the registered id of the env that ran it.
        spec_id: the :class:`~gym_llm_adapters.env_spec.RecordedEnvSpec` of that env (what a replay rebuilds it
            from; rollout files hold the spec itself); ``""`` for records made outside the collector or before it.
    """

    env_index: int
    task_id: int
    group_id: int
    round: int
    turn: int
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray
    reward: float
    terminated: bool
    truncated: bool
    version: int
    prompt_text: str = ""
    completion_text: str = ""
    finish_reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    env_id: str = ""
    spec_id: str = ""


@dataclass(slots=True)
class Trajectory:
    """One completed episode of one sub-env.

    Attributes:
        task_id / group_id / round: identify the task and the GRPO group sample.
        token_ids: ``(S,)`` int64, the full token sequence: prompt + sampled + env + sampled + ...
        policy_mask: ``(S,)`` int8, 1 where the policy sampled the token.
        logprobs: ``(S,)`` float32, engine log-probs at sampled positions, 0.0 elsewhere.
        prompt_length: tokens of the opening prompt (``policy_mask[:prompt_length] == 0``).
        rewards: per-step rewards; :attr:`reward` is their sum.
        versions: per-step engine versions.
        terminated / truncated: how the episode ended.
        steps: the per-step records.
        turn_tokens: how many of the trajectory's policy tokens each step contributed, in step order
            (``sum == policy_mask.sum()``; 0 for a step whose tokens were cut or restarted away). With
            ``versions`` it says which policy version sampled each policy token
            (:attr:`RolloutBatch.token_versions`). None in records written before it existed.
        token_exact: True when ``token_ids`` is exactly what the policy conditioned on and sampled at
            every turn (always in tokens mode). False when a text-mode env re-tokenised the conversation
            differently between turns: the sequence then restarts at that turn's observation and earlier
            turns count as context (``policy_mask == 0``); the step records stay exact.
        env_index: the sub-env (of the collector's env list, numbered across shards) that ran it.
        env_id: the registered id of the env that ran it (``"LLMGSM8K-v0"``; its class name if unregistered).
        spec_id: the env's recorded spec, as in :attr:`StepRecord.spec_id`.
        shared_turns: tree rollouts (``Collector(branch_turn=t)``): how many leading steps this trajectory shares
            with the rest of its group (the group's branch point; ``steps[:shared_turns]`` are the same records in
            every member). Their sampled tokens are context here (``policy_mask == 0``, ``turn_tokens`` 0): GRPO's
            advantage of a shared prefix is the group's mean, 0, so no member trains on it. 0 otherwise.
        scores: trajectory-level rewards from the collector's reward stages (:mod:`gym_llm_adapters.reward_stages`:
            an LLM judge, a group judge, a reward model), each ``{"source", "value", "weight", "error"}``: ``source``
            names the judge and rubric (or model), ``value`` is None when it failed and ``error`` says why.
        env_weight: the weight of the env's own reward in :attr:`reward` (the stages' ``weight`` are theirs).
    """

    task_id: int
    group_id: int
    round: int
    token_ids: np.ndarray
    policy_mask: np.ndarray
    logprobs: np.ndarray
    prompt_length: int
    rewards: list[float]
    versions: list[int]
    terminated: bool
    truncated: bool
    steps: list[StepRecord] = field(default_factory=list)
    token_exact: bool = True
    env_index: int = -1
    env_id: str = ""
    turn_tokens: list[int] | None = None
    spec_id: str = ""
    shared_turns: int = 0
    scores: list[dict[str, Any]] = field(default_factory=list)
    env_weight: float = 1.0

    @property
    def env_reward(self) -> float:
        """The env's own return: the sum of its step rewards."""
        return float(sum(self.rewards))

    @property
    def reward(self) -> float:
        """The episode's return: ``env_weight * env_reward + sum(weight * value)`` over the reward stages' scores
        (just the env's return without stages). A failed score counts 0 here; check :attr:`reward_failed`."""
        total = self.env_weight * self.env_reward if self.scores else self.env_reward
        return float(total + sum(s["weight"] * s["value"] for s in self.scores if s.get("value") is not None))

    @property
    def reward_error(self) -> str | None:
        """Why the episode's reward is unknown — a step's ``info["reward_error"]`` (a judge or grader that could not
        score) or a failed reward stage — else None."""
        for score in self.scores:
            if score.get("error") is not None or score.get("value") is None:
                return f"{score.get('source')}: {score.get('error')}"
        for step in self.steps:
            error = step.info.get("reward_error") if step.info else None
            if error:
                return str(error)
        return None

    @property
    def reward_failed(self) -> bool:
        """The reward could not be computed (:attr:`reward_error`): the trainer leaves the episode out of the loss."""
        return self.reward_error is not None

    def token_versions(self) -> np.ndarray:
        """``(S,)`` int64: the policy version that sampled each token (-1 where ``policy_mask == 0``).

        Uses :attr:`turn_tokens`; without it (old records) every policy token gets the oldest version."""
        out = np.full(len(self.token_ids), -1, dtype=np.int64)
        positions = np.flatnonzero(self.policy_mask)
        if self.turn_tokens is not None and len(self.turn_tokens) == len(self.versions) \
                and sum(self.turn_tokens) == len(positions):
            out[positions] = np.repeat(np.asarray(self.versions, dtype=np.int64), self.turn_tokens)
        else:
            out[positions] = min(self.versions) if self.versions else -1
        return out

    @property
    def num_policy_tokens(self) -> int:
        return int(self.policy_mask.sum())


@dataclass(slots=True)
class RolloutBatch:
    """Trajectories padded to a common length ``S`` (right padding) for training.

    Attributes:
        input_ids: ``(B, S)`` int64.
        attention_mask: ``(B, S)`` int8, 1 for real tokens.
        policy_mask: ``(B, S)`` int8, 1 for sampled tokens (the loss mask).
        logprobs: ``(B, S)`` float32, engine ("old") log-probs at sampled positions.
        rewards: ``(B,)`` float32, episode returns.
        group_ids / task_ids / rounds / versions: ``(B,)`` int64 (``versions`` = the oldest version
            that contributed tokens to the episode).
        ref_logprobs: ``(B, S)`` float32 reference-model log-probs, once computed (else None).
        advantages: ``(B,)`` float32, once computed (else None).
        token_versions: ``(B, S)`` int64, the policy version that sampled each policy token (-1 elsewhere):
            the turns of a multi-turn episode that ran across a weight update were sampled by different
            versions (:class:`~gym_llm_adapters.losses.GRPOLoss` treats tokens older than the trained version
            as off-policy). None for batches built by hand.
        truncated: ``(B,)`` bool, the episode was cut (length or turn limit) rather than finished; None for
            batches built by hand.
        reward_failed: ``(B,)`` bool, the episode's reward could not be computed (a judge or grader failure:
            :attr:`Trajectory.reward_failed`); its ``rewards`` entry is NaN, so nothing can train on it by accident
            (:class:`~gym_llm_adapters.losses.MCAdvantage` drops these rows first). None for batches built by hand.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    policy_mask: np.ndarray
    logprobs: np.ndarray
    rewards: np.ndarray
    group_ids: np.ndarray
    task_ids: np.ndarray
    rounds: np.ndarray
    versions: np.ndarray
    ref_logprobs: np.ndarray | None = None
    advantages: np.ndarray | None = None
    token_versions: np.ndarray | None = None
    truncated: np.ndarray | None = None
    reward_failed: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def from_trajectories(cls, trajectories: Sequence[Trajectory], *, pad_id: int = 0) -> "RolloutBatch":
        """Pad ``trajectories`` to the longest one. ``pad_id`` only fills ``input_ids``; the masks say
        what is real."""
        if not trajectories:
            raise ValueError("RolloutBatch.from_trajectories needs at least one trajectory.")
        B, S = len(trajectories), max(len(t.token_ids) for t in trajectories)
        input_ids = np.full((B, S), pad_id, dtype=np.int64)
        attention_mask = np.zeros((B, S), dtype=np.int8)
        policy_mask = np.zeros((B, S), dtype=np.int8)
        logprobs = np.zeros((B, S), dtype=np.float32)
        token_versions = np.full((B, S), -1, dtype=np.int64)
        for b, t in enumerate(trajectories):
            n = len(t.token_ids)
            input_ids[b, :n] = t.token_ids
            attention_mask[b, :n] = 1
            policy_mask[b, :n] = t.policy_mask
            logprobs[b, :n] = t.logprobs
            token_versions[b, :n] = t.token_versions()
        return cls(
            input_ids=input_ids,
            attention_mask=attention_mask,
            policy_mask=policy_mask,
            logprobs=logprobs,
            rewards=np.array([np.nan if t.reward_failed else t.reward for t in trajectories], dtype=np.float32),
            group_ids=np.array([t.group_id for t in trajectories], dtype=np.int64),
            task_ids=np.array([t.task_id for t in trajectories], dtype=np.int64),
            rounds=np.array([t.round for t in trajectories], dtype=np.int64),
            versions=np.array([min(t.versions) if t.versions else -1 for t in trajectories], dtype=np.int64),
            token_versions=token_versions,
            truncated=np.array([bool(t.truncated) for t in trajectories], dtype=bool),
            reward_failed=np.array([t.reward_failed for t in trajectories], dtype=bool),
        )

    def to_torch(self, device: Any = "cpu") -> dict[str, Any]:
        """The batch's arrays as torch tensors on ``device`` (masks as bool)."""
        import torch

        out: dict[str, Any] = {}
        for name in ("input_ids", "attention_mask", "policy_mask", "logprobs", "rewards", "group_ids",
                     "task_ids", "rounds", "versions", "ref_logprobs", "advantages", "token_versions", "truncated",
                     "reward_failed"):
            value = getattr(self, name)
            if value is None:
                continue
            tensor = torch.from_numpy(np.ascontiguousarray(value))
            if name in ("attention_mask", "policy_mask"):
                tensor = tensor.bool()
            out[name] = tensor.to(device)
        return out
