"""Reward functions with TRL's signature, built from the gym_llm env scorers.

TRL's ``GRPOTrainer`` calls every reward function as
``func(prompts=..., completions=..., completion_ids=..., **columns)`` — one list entry per completion, the
dataset's other columns (``answer``, ``task_id``, ...) as keyword lists, plus ``trainer_state``,
``log_metric`` and ``log_extra`` — and expects ``list[float | None]`` back (``None``: not applicable). It
names each function by its ``__name__`` in the logs (``rewards/<name>/mean``).

* :class:`GSM8KReward` — :func:`gym_llm.rewards.gsm8k.grade` on the reference in the ``answer`` column,
  the same reward as ``LLMGSM8K-v0`` (``correct + format_reward * formatted``);
* :class:`IFEvalReward` — :func:`gym_llm.rewards.ifeval.evaluate` on the ``instruction_id_list`` /
  ``instruction_kwargs`` columns, the same reward as ``LLMIFEval-v0``;
* :class:`ScorerReward` — any ``scorer(completion_text, **row) -> float`` (a custom verifier);
* :class:`EnvReward` — scores each completion by running the env itself on the row's ``task_id`` (one
  single-turn episode in text mode): exactly the env's reward, shaping hooks included, for any chat env;
* :class:`JudgeReward` — an LLM judge (:mod:`gym_llm.rewards.judge`), per completion or per group of completions
  of one prompt; None where the judge failed (TRL >= 1.16 gives an unscorable completion advantage 0, outside the
  group's baseline: never a 0 that trains);
* :func:`env_reward` — passes through the ``env_reward`` field that
  :class:`~gym_llm_adapters.trl.rollout.EnvRolloutFunc` returns (multi-turn, tools).

The columns come from :func:`~gym_llm_adapters.trl.dataset.env_dataset`.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable, Literal, Mapping, Sequence

__all__ = ["GSM8KReward", "IFEvalReward", "ScorerReward", "EnvReward", "JudgeReward", "env_reward", "completion_text"]


def completion_text(completion: Any) -> str:
    """The text of one TRL completion: a str (standard format) or a list of messages (conversational; the
    last message's content, which is the assistant's reply)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        content = completion[-1].get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):  # typed content blocks: keep the text ones
            return "".join(block.get("text", "") for block in content if isinstance(block, Mapping))
    raise TypeError(
        f"A completion must be a str or a list of {{'role', 'content'}} messages, got {type(completion).__name__}: "
        f"{completion!r:.80}."
    )


def _column(kwargs: Mapping[str, Any], name: str, expected: int, who: str, hint: str) -> list[Any]:
    if name not in kwargs:
        available = sorted(k for k in kwargs if k not in ("trainer_state", "log_metric", "log_extra", "completion_ids"))
        raise ValueError(
            f"{who} needs the column {name!r} in the train dataset ({hint}); the batch has columns {available}. "
            "Build the dataset with gym_llm_adapters.trl.env_dataset(...)."
        )
    values = list(kwargs[name])
    if len(values) != expected:
        raise ValueError(f"{who}: column {name!r} has {len(values)} entries for {expected} completions.")
    return values


def _log(kwargs: Mapping[str, Any], name: str, values: Sequence[float]) -> None:
    log_metric = kwargs.get("log_metric")
    if callable(log_metric) and values:
        log_metric(name, float(sum(values)) / len(values))


class GSM8KReward:
    """GSM8K correctness of each completion against the ``answer`` column: ``1.0`` if the final answer equals
    the reference, plus ``format_reward`` if the completion states it as ``#### N`` — ``LLMGSM8K-v0``'s reward.

    Logs ``gsm8k/correct`` and ``gsm8k/formatted`` (batch means) through TRL's ``log_metric``.

    >>> GSM8KReward(format_reward=0.1)(prompts=["q"] * 2, completions=["so #### 18", "It is 17."], answer=["18", "18"])
    [1.1, 0.0]
    """

    def __init__(self, *, format_reward: float = 0.0, answer_column: str = "answer", name: str = "gsm8k"):
        self.format_reward = float(format_reward)
        self.answer_column = answer_column
        self.__name__ = name

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        from gym_llm.rewards.gsm8k import grade

        answers = _column(kwargs, self.answer_column, len(completions), "GSM8KReward", "the reference answers")
        grades = [grade(completion_text(c), str(a)) for c, a in zip(completions, answers)]
        _log(kwargs, f"{self.__name__}/correct", [float(g.correct) for g in grades])
        _log(kwargs, f"{self.__name__}/formatted", [float(g.formatted) for g in grades])
        return [float(g.correct) + self.format_reward * float(g.formatted) for g in grades]


class IFEvalReward:
    """IFEval instruction following of each completion, scored by the official checks — ``LLMIFEval-v0``'s
    reward: the fraction of the row's instructions followed (``reward_mode="fraction"``) or 1.0 only if all are
    (``"all"``), strict or ``loose``; ``strip_thinking`` scores only the text after ``</think>``.

    Reads the ``instruction_id_list`` and ``instruction_kwargs`` (JSON text) columns. Logs
    ``ifeval/prompt_strict`` and ``ifeval/prompt_loose`` (batch means).
    """

    def __init__(self, *, reward_mode: Literal["fraction", "all"] = "fraction", loose: bool = False,
                 strip_thinking: bool = False, name: str = "ifeval"):
        from gym_llm.envs.ifeval import IFEvalHandler

        self.handler = IFEvalHandler(reward_mode, loose, strip_thinking)  # the env's own scoring (validates settings)
        self.__name__ = name

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        from gym_llm.envs.ifeval import _strip_thinking

        n = len(completions)
        ids = _column(kwargs, "instruction_id_list", n, "IFEvalReward", "each row's IFEval instruction ids")
        raw_kwargs = _column(kwargs, "instruction_kwargs", n, "IFEvalReward", "each row's instruction kwargs (JSON)")
        rewards, strict_all, loose_all = [], [], []
        for completion, instruction_ids, encoded in zip(completions, ids, raw_kwargs):
            text = completion_text(completion)
            if self.handler.strip_thinking:
                text = _strip_thinking(text)
            instruction_kwargs = json.loads(encoded) if isinstance(encoded, str) else list(encoded)
            result = self.handler.scorer.evaluate(text, list(instruction_ids), instruction_kwargs, None)
            rewards.append(self.handler.reward(result))
            strict_all.append(float(result.strict_all))
            loose_all.append(float(result.loose_all))
        _log(kwargs, f"{self.__name__}/prompt_strict", strict_all)
        _log(kwargs, f"{self.__name__}/prompt_loose", loose_all)
        return rewards


class ScorerReward:
    """A custom scorer as a TRL reward function: ``scorer(completion_text, **row)`` for each completion, where
    ``row`` holds that completion's value of every dataset column (``answer``, ``task_id``, ...). The scorer
    may return ``None`` (not applicable to that row).

    >>> reward = ScorerReward(lambda text, answer, **_: float(answer in text), name="contains_answer")
    >>> reward(prompts=["q", "q"], completions=["it is 42", "no idea"], answer=["42", "42"]), reward.__name__
    ([1.0, 0.0], 'contains_answer')
    """

    def __init__(self, scorer: Callable[..., float | None], *, name: str | None = None):
        if not callable(scorer):
            raise TypeError(f"scorer must be callable(completion_text, **row) -> float, got {type(scorer).__name__}.")
        self.scorer = scorer
        self.__name__ = name or getattr(scorer, "__name__", "scorer")

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        columns = {k: v for k, v in kwargs.items() if k not in ("trainer_state", "log_metric", "log_extra",
                                                                "completion_ids")}
        out: list[float | None] = []
        for i, completion in enumerate(completions):
            row = {k: v[i] for k, v in columns.items() if isinstance(v, Sequence) and len(v) == len(completions)}
            value = self.scorer(completion_text(completion), **row)
            out.append(None if value is None else float(value))
        return out


class EnvReward:
    """Scores each completion with the env itself: a text-mode scalar env runs the row's task
    (``reset(options={"task_id": ...})``) and the completion is its one assistant turn; the reward is the env's.

    Works for any single-turn gym_llm chat env (GSM8K, IFEval, a chat env with a ``reward_fn``, your own),
    shaping hooks included. Multi-turn episodes (tools, follow-ups) raise: score those with
    :class:`~gym_llm_adapters.trl.rollout.EnvRolloutFunc` and :func:`env_reward`.

    Args:
        env_id: the env id; ``**env_kwargs`` its arguments — the same as the dataset's, so task ids agree.
        task_column: the dataset column holding each row's task id.
    """

    def __init__(self, env_id: str, *, task_column: str = "task_id", name: str | None = None, **env_kwargs: Any):
        import gymnasium as gym

        import gym_llm  # noqa: F401  (registers the ids)
        from gym_llm_adapters.trl.dataset import chat_common

        if env_kwargs.get("mode", "text") != "text":
            raise ValueError("EnvReward scores text completions; drop mode= (the env runs in text mode).")
        self.env = gym.make(env_id, disable_env_checker=True, **env_kwargs)
        chat_common(self.env)  # a chat env, or a clear TypeError
        self.env_id, self.task_column = env_id, task_column
        self.__name__ = name or env_id.split("-")[0].removeprefix("LLM").lower()
        self._lock = threading.Lock()  # TRL may call reward functions from several threads (async rewards)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        task_ids = _column(kwargs, self.task_column, len(completions), f"EnvReward({self.env_id})", "each row's task id")
        out = []
        with self._lock:
            for completion, task_id in zip(completions, task_ids):
                self.env.reset(options={"task_id": int(task_id)})
                _, reward, terminated, truncated, _ = self.env.step(completion_text(completion))
                if not (terminated or truncated):
                    raise ValueError(
                        f"{self.env_id} did not end after one reply (task {task_id}): it is multi-turn (tools, "
                        "follow-ups). Use EnvRolloutFunc with the env_reward reward function instead."
                    )
                out.append(float(reward))
        return out

    def close(self) -> None:
        self.env.close()


class JudgeReward:
    """An LLM judge as a TRL reward function: each completion's judge reward in [0, 1], or None where the judge
    failed (TRL >= 1.16 leaves unscorable completions out of the group baseline and gives them advantage 0).

    With an :class:`~gym_llm.rewards.judge.LLMJudge` each completion is judged alone (concurrently); with a
    :class:`~gym_llm.rewards.judge.GroupJudge` the completions of one prompt in the call are judged together (TRL
    may split a prompt's group across processes: each process then ranks its own part). The task's criterion is the
    rubric's own or the row's ``criterion`` column (:func:`~gym_llm_adapters.trl.dataset.env_dataset` keeps the
    record's fields).

    Args:
        judge: the judge. criterion_column: the dataset column read as the task's ``criterion``.
    """

    def __init__(self, judge: Any, *, criterion_column: str = "criterion", name: str | None = None):
        if not hasattr(judge, "judge_group") and not hasattr(judge, "judge_many"):
            raise TypeError(f"judge must be an LLMJudge or a GroupJudge, got {type(judge).__name__}.")
        self.judge, self.criterion_column = judge, criterion_column
        self.__name__ = name or ("group_judge" if hasattr(judge, "judge_group") else "judge")

    def _task(self, prompt: Any, row: Mapping[str, Any]) -> Any:
        from gym_llm.core.messages import Message
        from gym_llm.core.tasks import Task

        if isinstance(prompt, str):
            messages = (Message("user", prompt),)
        else:
            messages = tuple(Message(m["role"], completion_text([m])) for m in prompt)
        data = {k: v for k, v in row.items() if isinstance(v, (str, int, float, bool))}
        if self.criterion_column in row:
            data["criterion"] = row[self.criterion_column]
        answer = row.get("answer")
        return Task(int(row.get("task_id", 0) or 0), messages, answer=None if answer is None else str(answer),
                    data=data)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        from gym_llm.core.messages import Message

        columns = {k: list(v) for k, v in kwargs.items() if isinstance(v, Sequence) and not isinstance(v, str)
                   and len(v) == len(completions)}
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
        tasks = [self._task(p, row) for p, row in zip(prompts, rows)]
        texts = [completion_text(c) for c in completions]
        if hasattr(self.judge, "judge_group"):
            groups: dict[str, list[int]] = {}
            for i, p in enumerate(prompts):
                groups.setdefault(json.dumps(p, sort_keys=True, default=str), []).append(i)
            out: list[float | None] = [None] * len(completions)
            for members in groups.values():
                task = tasks[members[0]]
                results = self.judge.judge_group(task, list(task.messages), [texts[i] for i in members])
                for i, r in zip(members, results):
                    out[i] = r.reward
        else:
            results = self.judge.judge_many([(t, [*t.messages, Message("assistant", x)]) for t, x in zip(tasks, texts)])
            out = [r.reward for r in results]
        _log(kwargs, f"{self.__name__}/failed", [float(v is None) for v in out])
        return out


def env_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """The env's episode return for each completion, as :class:`~gym_llm_adapters.trl.rollout.EnvRolloutFunc`
    reports it in its ``env_reward`` field (None where the env could not score it: a judge's failure, which TRL
    leaves out of the group's baseline with advantage 0). Pass it as ``reward_funcs`` together with that rollout
    function."""
    if "env_reward" not in kwargs:
        raise ValueError(
            "env_reward reads the 'env_reward' field that EnvRolloutFunc returns; pass "
            "rollout_func=EnvRolloutFunc(...) to GRPOTrainer (or score with GSM8KReward/IFEvalReward/EnvReward)."
        )
    values = list(kwargs["env_reward"])
    if len(values) != len(completions):
        raise ValueError(f"env_reward: {len(values)} rewards for {len(completions)} completions.")
    return [None if v is None else float(v) for v in values]
