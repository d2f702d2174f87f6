"""``LLMReasoningGym-v0``: any of reasoning-gym's procedural datasets, scored by the dataset's own ``score_answer``.

One module: the task loader over ``reasoning_gym.create_dataset``, the grade function (the reply's final answer —
``<answer>`` tag, else an ``Answer:`` line — scored by the dataset, under a deadline), and the env declared by its
builder. reasoning-gym is an optional dependency: ``pip install 'gym-llm[reasoning_gym]'``.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Mapping

from gym_llm.core.env import LLMEnv
from gym_llm.core.episode import EnvParts
from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task
from gym_llm.envs.scored import Grade, scored_reply_parts
from gym_llm.rewards.answers import FinalAnswer, decorations_removed, read_final_answer, tagged_answer_problem
from gym_llm.rewards.final_answer import answer_problem, answer_token, answer_value
from gym_llm.rewards.deadline import DeadlineExceeded, isolate_hook

__all__ = ["DEFAULT_REASONING_GYM_SYSTEM_PROMPT", "LLMReasoningGymEnv", "build_reasoning_gym", "dataset_names",
           "load_reasoning_gym_tasks", "score_entry", "worked_solution"]

DEFAULT_REASONING_GYM_SYSTEM_PROMPT = (
    "Think the problem through step by step. Then give only the final answer, in exactly the form the question "
    "asks for, inside <answer> </answer> tags."
)
"""The default system prompt: reasoning-gym's scorers read the ``<answer>`` tag."""

DEFAULT_SCORE_TIMEOUT_S = 10.0
"""A reply's scoring (some datasets parse it with sympy) is killed past this and graded wrong."""


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as e:
        raise ImportError("LLMReasoningGym-v0 generates its tasks with reasoning-gym: "
                          "pip install 'gym-llm[reasoning_gym]'.") from e
    return reasoning_gym


def dataset_names() -> list[str]:
    """Every dataset name reasoning-gym registers (``gym-llm list`` shows them under ``LLMReasoningGym-v0``)."""
    _reasoning_gym()  # a missing package: the error says which extra installs it
    from reasoning_gym.factory import DATASETS  # filled by importing reasoning_gym

    return sorted(DATASETS)


def _config_key(config: Mapping[str, Any]) -> str:
    try:
        return json.dumps(dict(config), sort_keys=True)
    except TypeError as e:
        raise TypeError(f"config must be a JSON-like mapping of the dataset's settings, got {config!r}: {e}") from e


@functools.lru_cache(maxsize=64)
def _scorer(dataset: str, config_key: str):
    """One dataset object per (name, settings) in this process, for its ``score_answer``."""
    return _reasoning_gym().create_dataset(dataset, size=1, seed=0, **json.loads(config_key))


def score_entry(dataset: str, config_key: str, answer: str, entry: Mapping[str, Any]) -> float:
    """``score_answer(answer, entry)`` of the named dataset (made once per process)."""
    return float(_scorer(dataset, config_key).score_answer(answer, dict(entry)))


def load_reasoning_gym_tasks(dataset: str = "basic_arithmetic", *, config: Mapping[str, Any] | None = None,
                             size: int = 1_000, seed: int = 0) -> list[Task]:
    """``size`` tasks of reasoning-gym dataset ``dataset`` (see :func:`dataset_names`), generated with ``seed`` and
    the dataset's settings ``config`` (its difficulty knobs: e.g. ``{"min_terms": 2, "max_terms": 4}`` for
    ``basic_arithmetic``; a curriculum passes the settings of its current level).

    Raises:
        ValueError: an unknown dataset name (the message lists the close ones) or settings the dataset refuses.
    """
    names = dataset_names()
    if dataset not in names:
        import difflib

        close = difflib.get_close_matches(str(dataset), names, n=5, cutoff=0.5)
        raise ValueError(f"reasoning-gym has no dataset {dataset!r}" + (f"; did you mean {close}?" if close else "")
                         + f" ({len(names)} datasets: `gym-llm list` shows them).")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an int >= 1, got {size!r}.")
    settings = dict(config or {})
    try:
        data = _generated(dataset, _config_key(settings), size, int(seed))
    except (TypeError, ValueError, AssertionError) as e:
        raise ValueError(f"reasoning-gym refused the settings {settings} for {dataset!r}: {type(e).__name__}: {e}") \
            from e
    tasks = []
    for index, entry in enumerate(data):
        answer = entry.get("answer")  # None: the dataset checks an answer's validity instead (many are right)
        record: dict[str, Any] = {"dataset": dataset, "entry": entry}
        solution = worked_solution(dataset, entry)
        if solution is not None:
            record["solution"] = solution  # what an SFT warm start trains on (gym_llm_adapters.training.sft_data)
        tasks.append(Task(index, (Message("user", str(entry["question"])),), None if answer is None else str(answer),
                          record))
    return tasks


_CHAIN = re.compile(r"^\s*(-?\d+)((?:\s*[-+]\s*-?\d+)+)\s*$")
_TERM = re.compile(r"([-+])\s*(-?\d+)")


def worked_solution(dataset: str, entry: Mapping[str, Any]) -> str | None:
    r"""A reply the env scores correct, for a supervised warm start: ``<answer>ANSWER</answer>`` for any dataset
    whose entry has an answer, preceded for ``chain_sum`` by its left-to-right partial sums
    (``15 - 43 = -28, -28 - 75 = -103``: each line one operation, the way a small model can learn to carry it out),
    and for ``leg_counting`` by each animal's legs times its count (from reasoning-gym's own table), then the sum.
    ``None`` where the dataset has no single answer.

    >>> worked_solution("chain_sum", {"answer": "-103", "metadata": {"expression": "15 - 43 - 75"}})
    '15 - 43 = -28\n-28 - 75 = -103\n<answer>-103</answer>'
    >>> worked_solution("leg_counting", {"answer": "36", "metadata": {"animals": {"spider": 3, "snake": 2, "dog": 3}}})
    'spider: 3 x 8 = 24\nsnake: 2 x 0 = 0\ndog: 3 x 4 = 12\n24 + 0 + 12 = 36\n<answer>36</answer>'
    >>> worked_solution("gcd", {"answer": "3"})
    '<answer>3</answer>'
    """
    answer = entry.get("answer")
    if answer is None:
        return None
    final = f"<answer>{answer}</answer>"
    if dataset == "leg_counting":
        return _legs_solution(entry, final)
    expression = (entry.get("metadata") or {}).get("expression") if dataset == "chain_sum" else None
    match = _CHAIN.match(expression) if isinstance(expression, str) else None
    if match is None:
        return final
    total, lines = int(match.group(1)), []
    for sign, value in _TERM.findall(match.group(2)):
        new = total + int(value) if sign == "+" else total - int(value)
        lines.append(f"{total} {sign} {value} = {new}")
        total = new
    if str(total) != str(answer).strip():  # not the dataset's reading of its expression: answer only
        return final
    return "\n".join(lines + [final])


def _legs_solution(entry: Mapping[str, Any], final: str) -> str:
    from reasoning_gym.arithmetic.leg_counting import ANIMALS  # the dataset's table of legs per animal

    animals = (entry.get("metadata") or {}).get("animals")
    if not isinstance(animals, Mapping) or not all(name in ANIMALS for name in animals):
        return final
    products = [(name, int(count), ANIMALS[name] * int(count)) for name, count in animals.items()]
    if str(sum(p for _, _, p in products)) != str(entry.get("answer")).strip():
        return final
    lines = [f"{name}: {count} x {ANIMALS[name]} = {product}" for name, count, product in products]
    total = " + ".join(str(product) for _, _, product in products) + f" = {sum(p for _, _, p in products)}"
    return "\n".join(lines + [total, final])


@functools.lru_cache(maxsize=8)
def _generated(dataset: str, config_key: str, size: int, seed: int) -> tuple[dict[str, Any], ...]:
    """The dataset's entries, generated once per process per settings (an env made again with the same arguments,
    and every sub-env, reads the same entries)."""
    return tuple(_reasoning_gym().create_dataset(dataset, size=size, seed=seed, **json.loads(config_key)))


_PLAIN_NUMBER_RE = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_MORE_RE = re.compile(r"\s*(?:[,;/|]|\bor\b|\band\b)\s*\S", re.IGNORECASE)  # the reference, then more candidates


def _read(read: FinalAnswer, reference: str) -> tuple[str, str | None]:
    """``(candidate, problem)``: the form of the answer to score beside the tag's text as written, and why the
    answer breaks the one-final-answer rule. A plain-number reference: the number the tag states
    (``**-4**``, ``-4.``, ``x = -4``, ``18 legs`` -> ``-4``/``18``), one number only (``18 or 19`` is wrong); any
    other: the tag without markdown, math delimiters, quotes or a closing full stop, and not the reference followed by
    more candidates ("a, b, c, b, a, c": some scorers pay a reply whose start is right)."""
    if _PLAIN_NUMBER_RE.fullmatch(reference.strip()):
        problem = answer_problem(read.text)
        value = answer_value(read.text)

        def same(other: str) -> bool:
            return answer_problem(other, later_sentences=False) is None and answer_value(other) == value

        candidate = answer_token(read.text) or read.text
    else:
        candidate, value = decorations_removed(read.text), None

        def same(other: str) -> bool:
            return decorations_removed(other) == candidate

        starts = candidate.casefold().startswith(reference.strip().casefold())
        extra = candidate[len(reference.strip()):] if starts else ""
        problem = f"more than one answer ({candidate[:40]})" if reference.strip() and _MORE_RE.match(extra) else None
    return candidate, problem or tagged_answer_problem(read, value, same)


def _grade(reply: str, task: Task, *, scorer: Any) -> Grade:
    read = read_final_answer(reply)
    reference = task.answer or ""
    if not read.found:
        return Grade(False, False, "", reference, score=0.0,
                     problem="no <answer>...</answer> (or 'Answer:' line) in the reply")
    candidate, problem = _read(read, reference)
    if problem is not None:
        return Grade(False, True, read.text, reference, score=0.0, problem=problem)
    try:
        score = float(scorer(read.text, task.data["entry"]))
        if score < 1.0 and candidate != read.text:  # the same answer without its decoration: the dataset decides
            score = max(score, float(scorer(candidate, task.data["entry"])))
        score = min(1.0, max(0.0, score))
    except DeadlineExceeded as e:
        return Grade(False, True, read.text, reference, score=0.0, error=f"DeadlineExceeded: {e}")
    return Grade(score >= 1.0, True, read.text, reference, score=score)


def build_reasoning_gym(*, dataset: str = "basic_arithmetic", config: Mapping[str, Any] | None = None,
                        size: int = 1_000, seed: int = 0, score_timeout_s: float | None = DEFAULT_SCORE_TIMEOUT_S,
                        system_prompt: str | None = DEFAULT_REASONING_GYM_SYSTEM_PROMPT, **common: Any) -> EnvParts:
    """The env's parts; ``**common``: ``format_reward``, ``reward_fn``, ``task_order``, tools and every ``ChatConfig``
    field (:func:`~gym_llm.envs.scored.scored_reply_parts`)."""
    tasks = load_reasoning_gym_tasks(dataset, config=config, size=size, seed=seed)
    scorer = functools.partial(score_entry, dataset, _config_key(config or {}))
    scorer = isolate_hook(scorer, score_timeout_s, name=f"{dataset}.score_answer")
    return scored_reply_parts(tasks, functools.partial(_grade, scorer=scorer), system_prompt=system_prompt, **common)


class LLMReasoningGymEnv(LLMEnv, build=build_reasoning_gym):
    """Any reasoning-gym dataset (arithmetic, algebra, logic, graphs, puzzles, ciphers, ...; 100+ generators).

    ## Description
    One generated problem per episode; the policy answers once, with its final answer inside ``<answer> </answer>``
    tags (an ``Answer:`` line is read too). The dataset's own ``score_answer`` scores it — exact match for most,
    partial credit for some — in a worker process under ``score_timeout_s`` (a reply that makes a scorer hang is
    graded 0 with ``info["reward_error"]``).

    ## Action Space
    Text mode: ``UnicodeText(max_action_chars)``; tokens mode: padded ids + mask (see ``LLMChat-v0``).

    ## Observation Space
    The problem rendered with the chat template after the system prompt (text), or its token ids (tokens mode).

    ## Rewards
    | outcome | reward |
    |---|---|
    | the dataset's ``score_answer`` of the tagged answer | 0.0–1.0 |
    | no ``<answer>`` tag or ``Answer:`` line | 0.0 |
    | plus, if an answer was stated | ``format_reward`` (default 0.0) |
    | plus, if given | ``reward_fn(task, messages)`` |

    ``info``: ``correct`` (score 1.0), ``score``, ``formatted``, ``extracted_answer``, ``reference_answer`` (the
    dataset's answer), ``answer_problem``.

    ## Starting State
    The next problem of the task stream (seeded shuffle; ``options={"task_id": i}`` forces one).
    ``task.data["entry"]`` is reasoning-gym's entry (question, answer, metadata).

    ## Episode End
    Terminated after the one assistant turn.

    ## Arguments
    * ``dataset`` (default ``"basic_arithmetic"``; ``gym-llm list`` names them all), ``config`` (the dataset's
      settings: its difficulty knobs), ``size`` (problems generated), ``seed``. **Held-out sets:** reasoning-gym
      draws problem ``i`` from ``seed + i``, so ``seed=0`` and ``seed=1`` share all but one problem; give the
      evaluation env a seed more than ``size`` away from the training one (e.g. ``seed=1_000_000``), and expect
      repeats anyway where a dataset's problem space is small.
    * ``score_timeout_s`` (None: score in the env's thread), ``system_prompt``, ``format_reward``, ``reward_fn``,
      ``task_order``, tools, and every ``ChatConfig`` field.

    ## Vectorized environment
    ``gym.make_vec("LLMReasoningGym-v0", num_envs=8, group_size=4, dataset="chain_sum")``
    (:class:`LLMReasoningGymVectorEnv`, derived).

    ## Version History
    * v0: initial version.
    * v0, reward change (issue 45): where the reference is a plain number the tag's one number is scored (``**-4**.``,
      ``x = -4``, ``18 legs``) and several candidates score 0.0 (the dataset gave ``18 or 19`` partial credit); other
      tags are scored as written and without decoration; another tag or ``Answer:`` line with another answer, a hedge,
      or a correction or other answer after the tag scores 0.0; tags before ``</think>`` are not read. The id stays
      ``-v0`` (see ``LLMGSM8K-v0``).
    """
