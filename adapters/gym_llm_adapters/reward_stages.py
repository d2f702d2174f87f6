"""Reward stages: trajectory-level rewards that need more than one episode at a time, run by the collector.

An env's ``reward_fn`` sees one conversation inside ``env.step``. Some rewards are better taken over whole
episodes and whole GRPO groups: an LLM judge called for a batch of replies concurrently, a judge that sees all G
replies of a group and scores them against each other (RULER-style), a sequence-classifier reward model run batched
on its device. The collector (``Collector(reward_stages=[...])``) runs each stage on every released batch of whole
groups, before the batch is written or returned:

* each trajectory gets one entry per stage in :attr:`Trajectory.scores`: ``{"source", "value", "weight", "error"}``
  (``source`` names the judge and rubric, or the reward model), beside the env's own reward;
* :attr:`Trajectory.reward` is ``env_weight * env_reward + sum(weight * value)``;
* a failed score (``value`` None) makes :attr:`Trajectory.reward_failed` true: the collector counts it
  (``CollectorStats.reward_failed``), the rollout file keeps it, and the trainer leaves it out of the loss.

A stage is any object with ``source: str``, ``weight: float`` and
``score(trajectories, tasks) -> list[Score]`` (one per trajectory, in order); ``tasks[i]`` is trajectory ``i``'s
:class:`~gym_llm.core.tasks.Task` (its request, reference answer and record). :func:`conversation_of` rebuilds the
conversation a trajectory's last reply ends.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task
from gym_llm_adapters.types import Trajectory

__all__ = ["Score", "RewardStage", "JudgeStage", "GroupJudgeStage", "RewardModelStage", "JudgeSettings",
           "apply_stages", "check_stage_tasks", "conversation_of", "judge_usage"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Score:
    """One stage's score of one trajectory: ``value`` None (with ``error``) when it could not be computed."""

    value: float | None
    error: str | None = None


class RewardStage(Protocol):
    source: str
    weight: float

    def score(self, trajectories: Sequence[Trajectory], tasks: Sequence[Task]) -> list[Score]: ...


def conversation_of(trajectory: Trajectory, task: Task) -> list[Message]:
    """The conversation trajectory's last reply ends: the task's opening messages, then each assistant reply (the
    step records' ``completion_text``) with the task's scripted ``follow_ups`` between them.

    Only turns a task's record scripts are rebuilt: an env-wide ``follow_ups`` list, a user simulator, tool results or
    an env's feedback between turns are not in it, so judge multi-turn episodes of such envs with a rubric that reads
    ``{prompt}`` and ``{reply}`` (the built-in ones), or score them inside the env (``reward_fn=judge``), which sees the
    whole conversation."""
    messages = list(task.messages)
    follow_ups = list(task.data.get("follow_ups") or ())
    for k, step in enumerate(trajectory.steps):
        if k > 0 and k - 1 < len(follow_ups):
            messages.append(Message("user", str(follow_ups[k - 1])))
        messages.append(Message("assistant", step.completion_text))
    return messages


def _check_weight(weight: float) -> float:
    weight = float(weight)
    if not np.isfinite(weight):
        raise ValueError(f"A reward stage's weight must be a finite number, got {weight!r}.")
    return weight


class JudgeStage:
    """Every trajectory's last reply scored by an :class:`~gym_llm.rewards.judge.LLMJudge`, concurrently (up to the
    judge's ``max_concurrency`` calls in flight): ``value`` is the judge's reward in [0, 1]."""

    def __init__(self, judge: Any, weight: float = 1.0):
        self.judge, self.weight = judge, _check_weight(weight)
        self.source = judge.source

    def score(self, trajectories: Sequence[Trajectory], tasks: Sequence[Task]) -> list[Score]:
        results = self.judge.judge_many([(task, conversation_of(t, task)) for t, task in zip(trajectories, tasks)])
        return [Score(r.reward, r.error) for r in results]


class GroupJudgeStage:
    """Each GRPO group's replies scored together by a :class:`~gym_llm.rewards.judge.GroupJudge` (one call per
    group, groups concurrently). Members are shown to the judge in sub-env order, whatever order the collector
    finished them in, and each score goes back to the trajectory it was given for."""

    def __init__(self, judge: Any, weight: float = 1.0):
        self.judge, self.weight = judge, _check_weight(weight)
        self.source = judge.source

    def score(self, trajectories: Sequence[Trajectory], tasks: Sequence[Task]) -> list[Score]:
        groups: dict[tuple[int, int], list[int]] = {}
        for i, t in enumerate(trajectories):
            groups.setdefault((int(t.group_id), int(t.round)), []).append(i)
        members = [sorted(rows, key=lambda i: (trajectories[i].env_index, i)) for rows in groups.values()]

        def one(rows: list[int]) -> list[Any]:
            task = tasks[rows[0]]
            if any(tasks[i].task_id != task.task_id for i in rows):
                raise ValueError("A GRPO group holds different tasks; a group judge compares replies to one task.")
            conversation = conversation_of(trajectories[rows[0]], task)
            before = conversation[:-1]
            replies = [trajectories[i].steps[-1].completion_text if trajectories[i].steps else "" for i in rows]
            return self.judge.judge_group(task, before, replies)

        out: list[Score | None] = [None] * len(trajectories)
        workers = max(1, min(self.judge.client.max_concurrency, len(members)))
        with ThreadPoolExecutor(workers, thread_name_prefix="group_judge") as pool:
            for rows, results in zip(members, pool.map(one, members)):
                for i, r in zip(rows, results, strict=True):
                    out[i] = Score(r.reward, r.error)
        return [s for s in out if s is not None]


class RewardModelStage:
    """A sequence-classifier reward model (``AutoModelForSequenceClassification`` with one label), batched.

    The text scored is the task's conversation ending in the trajectory's last reply, rendered with the reward
    model's chat template when its tokenizer has one (``prompt + reply`` otherwise); ``value`` is the model's logit
    (``(B, 1)`` -> ``(B,)``), optionally affine-scaled: ``scale * logit + shift``.

    Args:
        model: a path or hub id, or a loaded model (then ``tokenizer`` is required).
        tokenizer: its tokenizer (default: loaded from ``model``).
        weight: the stage's weight in the episode's reward.
        device: where the model runs (``"cpu"``, ``"cuda:1"``: the policy's device or another).
        batch_size: texts per forward pass; max_length: tokens kept per text (left-truncated: the reply survives).
        scale / shift: map the logit to the reward's scale.
        name: the source's name (default: the model's path).
    """

    def __init__(self, model: Any, *, tokenizer: Any = None, weight: float = 1.0, device: str = "cpu",
                 batch_size: int = 16, max_length: int = 2048, scale: float = 1.0, shift: float = 0.0,
                 dtype: str = "float32", name: str | None = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.weight = _check_weight(weight)
        if batch_size < 1 or max_length < 8:
            raise ValueError(f"batch_size must be >= 1 and max_length >= 8, got {batch_size} and {max_length}.")
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            path = str(model)
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=getattr(torch, dtype))
        else:
            if tokenizer is None:
                raise ValueError("A loaded reward model needs its tokenizer: pass tokenizer=.")
            path, self.model, self.tokenizer = getattr(model, "name_or_path", type(model).__name__), model, tokenizer
        if int(self.model.config.num_labels) != 1:
            raise ValueError(f"A reward model scores with one label; {path} has num_labels="
                             f"{self.model.config.num_labels}. Load a model made with num_labels=1.")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:  # the classifier reads the last non-pad token of each row
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(device).eval()
        self.device, self.batch_size, self.max_length = device, int(batch_size), int(max_length)
        self.scale, self.shift = float(scale), float(shift)
        self.source = f"reward_model:{name or path}"

    def text(self, messages: Sequence[Message]) -> str:
        """What the model scores for a conversation."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template([{"role": m.role, "content": m.content} for m in messages],
                                                      tokenize=False)
        return "\n".join(m.content for m in messages)

    def score_texts(self, texts: Sequence[str]) -> np.ndarray:
        """``(N,)`` float64 logits of ``texts``, ``batch_size`` at a time (right-padded; each row's last real
        token is what the classifier reads), then ``scale * logit + shift``."""
        import torch

        out: list[np.ndarray] = []
        side = self.tokenizer.truncation_side
        self.tokenizer.truncation_side = "left"
        try:
            for start in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(list(texts[start:start + self.batch_size]), return_tensors="pt", padding=True,
                                     truncation=True, max_length=self.max_length, padding_side="right")
                with torch.no_grad():
                    logits = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits
                out.append(logits[:, 0].float().cpu().double().numpy())
        finally:
            self.tokenizer.truncation_side = side
        scores = np.concatenate(out) if out else np.zeros(0)
        return self.scale * scores + self.shift

    def score(self, trajectories: Sequence[Trajectory], tasks: Sequence[Task]) -> list[Score]:
        texts = [self.text(conversation_of(t, task)) for t, task in zip(trajectories, tasks)]
        try:
            values = self.score_texts(texts)
        except Exception as e:  # noqa: BLE001  (an OOM or a device error: the batch's rewards are unknown, not 0)
            logger.warning("the reward model failed on a batch of %d: %s", len(texts), e)
            return [Score(None, f"{type(e).__name__}: {e}") for _ in texts]
        return [Score(float(v)) if np.isfinite(v) else Score(None, "the reward model returned a non-finite score")
                for v in values]


def check_stage_tasks(stage: Any, tasks: Sequence[Task], env_id: str = "the env") -> None:
    """Refuse a judge stage whose prompt cannot be built from ``tasks`` (a rubric field the tasks lack), trying the
    first task: ``ValueError`` naming the field, before any rollout."""
    from gym_llm.rewards.judge import JudgeError

    judge = getattr(stage, "judge", None)
    if judge is None or not len(tasks):
        return
    task = tasks[0]
    try:
        if hasattr(judge, "judge_group"):
            judge.prompt(task, list(task.messages), ["probe"])
        else:
            judge.prompt(task, [*task.messages, Message("assistant", "probe")])
    except JudgeError as e:
        raise ValueError(f"The reward stage {stage.source} cannot judge {env_id}'s tasks: {e}. Give the tasks the "
                         "fields the rubric names (or pass the criterion itself), or change the rubric.") from None


def judge_usage(stages: Sequence[Any]) -> tuple[int, int]:
    """``(calls, tokens)`` the stages' judges have sent so far (prompt + completion tokens the servers reported)."""
    clients = [stage.judge.client for stage in stages if hasattr(getattr(stage, "judge", None), "client")]
    return sum(c.calls for c in clients), sum(c.tokens for c in clients)


def apply_stages(trajectories: Sequence[Trajectory], tasks: Sequence[Task], stages: Sequence[Any],
                 env_weight: float = 1.0) -> int:
    """Score ``trajectories`` with every stage and record the scores on them (:attr:`Trajectory.scores`, replacing
    any earlier ones; ``env_weight`` set). Returns how many trajectories have a failed reward afterwards."""
    if len(tasks) != len(trajectories):
        raise ValueError(f"apply_stages needs one task per trajectory; got {len(tasks)} for {len(trajectories)}.")
    results = []
    for stage in stages:
        scores = stage.score(trajectories, tasks)
        if len(scores) != len(trajectories):
            raise RuntimeError(f"The reward stage {stage.source} returned {len(scores)} scores for "
                               f"{len(trajectories)} trajectories; a stage returns one per trajectory, in order.")
        results.append((stage, scores))
    for i, t in enumerate(trajectories):
        t.env_weight = float(env_weight)
        t.scores = [{"source": stage.source, "value": scores[i].value, "weight": stage.weight,
                     "error": scores[i].error} for stage, scores in results]
    return sum(t.reward_failed for t in trajectories)


@dataclass(frozen=True)
class JudgeSettings:
    """An LLM judge as the training loop's reward stage (``gym-llm train --judge-url ... --judge-model ...``).

    Attributes:
        url / model: the OpenAI-compatible endpoint (``http://127.0.0.1:8000/v1``) and the model it serves.
        mode: ``"reply"`` (each reply judged alone: :class:`JudgeStage`) or ``"group"`` (each GRPO group in one call:
            :class:`GroupJudgeStage`).
        criterion: the criterion the rubric asks about; None reads each task's ``criterion`` field.
        low / high: the integer score range.
        weight: the judge's weight in the episode's reward; env_weight: the env's own reward's weight.
        structured: constrain the judge's output to the score format (vLLM servers).
        api_key_env: the variable holding the endpoint's key (providers).
        deadline_s / max_concurrency: per judgement, and calls in flight.
        defences: ``"default"`` (delimited reply, last line only), ``"all"`` (also refuse score-format replies) or
            ``"none"`` (measurement only).
        score: ``"sampled"`` (the integer the judge wrote) or ``"expected"`` (its probability-weighted score; per-reply
            mode and a range within 0..9: :class:`~gym_llm.rewards.judge.LLMJudge`).
    """

    url: str
    model: str
    mode: str = "reply"
    criterion: str | None = None
    low: int = 0
    high: int = 10
    weight: float = 1.0
    env_weight: float = 1.0
    structured: bool = False
    api_key_env: str | None = None
    deadline_s: float = 60.0
    max_concurrency: int = 8
    defences: str = "default"
    score: str = "sampled"

    def __post_init__(self) -> None:
        if self.score not in ("sampled", "expected") or (self.score == "expected" and self.mode != "reply"):
            raise ValueError(f"The judge's score must be 'sampled' or 'expected' (per-reply mode only), got "
                             f"{self.score!r} with mode {self.mode!r}.")
        if self.mode not in ("reply", "group"):
            raise ValueError(f"The judge's mode must be 'reply' or 'group', got {self.mode!r}.")
        if self.defences not in ("default", "all", "none"):
            raise ValueError(f"The judge's defences must be 'default', 'all' or 'none', got {self.defences!r}.")
        _check_weight(self.weight)
        _check_weight(self.env_weight)

    def stage(self, *, probe: bool = True) -> Any:
        """The reward stage (probing the endpoint once: an unreachable server or an unserved model fails here)."""
        from gym_llm.rewards.judge import Defences, Endpoint, GroupJudge, LLMJudge, Rubric

        endpoint = Endpoint(self.url, self.model, api_key_env=self.api_key_env, structured=self.structured)
        defences = {"default": Defences(), "all": Defences.all(), "none": Defences.none()}[self.defences]
        common = dict(defences=defences, deadline_s=self.deadline_s, max_concurrency=self.max_concurrency,
                      probe=probe)
        if self.mode == "group":
            return GroupJudgeStage(GroupJudge(endpoint, Rubric.group_criterion(self.criterion, low=self.low,
                                                                               high=self.high), **common), self.weight)
        return JudgeStage(LLMJudge(endpoint, Rubric.criterion(self.criterion, low=self.low, high=self.high),
                                   score=self.score, **common), self.weight)
