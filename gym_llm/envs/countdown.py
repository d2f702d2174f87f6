"""``LLMCountdown-v0``: reach a target number with + - * / over given numbers (TinyZero's Countdown task).

One module: the task generator and loader, an exact expression checker (no ``eval``), the grade function, and the
env declared by its builder (``class LLMCountdownEnv(LLMEnv, build=build_countdown)``; the vector env is derived).
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter
from fractions import Fraction
from typing import Any, Literal, Sequence

from gym_llm.core.env import LLMEnv
from gym_llm.core.episode import EnvParts
from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task
from gym_llm.envs.common import take_arguments, with_arguments_of
from gym_llm.envs.scored import Grade, scored_reply_parts
from gym_llm.rewards.answers import decorations_removed, read_final_answer, tagged_answer_problem
from gym_llm.tasks.loading import load_hub_dataset, records_from_source

__all__ = ["DEFAULT_COUNTDOWN_PROMPT", "CountdownError", "LLMCountdownEnv", "build_countdown", "check_expression",
           "equation_of", "evaluate", "generate_countdown", "grade_countdown", "load_countdown_tasks"]

DEFAULT_COUNTDOWN_PROMPT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use +, -, * and / and "
    "parentheses, and each number at most once. Think it through, then write the equation alone inside "
    "<answer> </answer> tags, for example <answer> (1 + 2) * 3 </answer>."
)
"""The default prompt: ``{numbers}`` (comma-separated) and ``{target}`` are filled in."""

MAX_EXPRESSION_CHARS = 256
"""Longer answers are refused before parsing (a Countdown equation over a handful of numbers is a few dozen)."""
MAX_DEPTH = 32
"""Parentheses nested deeper are refused (the parser recurses once per level)."""

_TOKEN = re.compile(r"[ \t\n]*(?:([0-9]+)|([-+*/×÷()]))")  # ASCII digits only (\d would take any script's digits)
_OPS = {"×": "*", "÷": "/"}


class CountdownError(ValueError):
    """An answer that is not a valid Countdown expression; the message says why (``info["answer_problem"]``)."""


def _tokens(text: str) -> list[str]:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CountdownError(f"the expression is {len(text)} characters; at most {MAX_EXPRESSION_CHARS}")
    out, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            bad = text[position:].lstrip()[:1]
            raise CountdownError(f"unexpected {bad!r}: only whole numbers, + - * / and parentheses are allowed")
        out.append(match.group(1) or _OPS.get(match.group(2), match.group(2)))
        position = match.end()
    if not out:
        raise CountdownError("the answer is empty")
    return out


def evaluate(text: str) -> tuple[Fraction, list[int]]:
    """``(value, numbers)`` of an arithmetic expression over whole numbers with ``+ - * /`` and parentheses, computed
    exactly (rationals), and the numbers it uses in order. ``=`` and what follows it are ignored (``"2*3 = 6"``).

    A recursive-descent parser over a token list: nothing is executed, input is bounded
    (:data:`MAX_EXPRESSION_CHARS`, :data:`MAX_DEPTH`), and unary signs, decimals, powers and names are refused.

    >>> evaluate("(100 - 4) / (7 - 3)")
    (Fraction(24, 1), [100, 4, 7, 3])
    >>> evaluate("6 / 4")[0]
    Fraction(3, 2)

    Raises:
        CountdownError: the reason the text is not such an expression (division by zero included).
    """
    tokens = _tokens(text.split("=", 1)[0])
    numbers: list[int] = []
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> str:
        nonlocal position
        position += 1
        return tokens[position - 1]

    def expression(depth: int) -> Fraction:
        value = term(depth)
        while peek() in ("+", "-"):
            value = value + term(depth) if take() == "+" else value - term(depth)
        return value

    def term(depth: int) -> Fraction:
        value = factor(depth)
        while peek() in ("*", "/"):
            op = take()
            right = factor(depth)
            if op == "*":
                value = value * right
            elif right == 0:
                raise CountdownError("division by zero")
            else:
                value = value / right
        return value

    def factor(depth: int) -> Fraction:
        token = peek()
        if token is None:
            raise CountdownError("the expression ends too early")
        if token == "(":
            if depth >= MAX_DEPTH:
                raise CountdownError(f"parentheses nested deeper than {MAX_DEPTH}")
            take()
            value = expression(depth + 1)
            if peek() != ")":
                raise CountdownError("a '(' is not closed")
            take()
            return value
        if token.isdigit():
            take()
            if len(token) > 1 and token[0] == "0":
                raise CountdownError(f"{token!r}: numbers are written without leading zeros")
            numbers.append(int(token))
            return Fraction(int(token))
        raise CountdownError(f"unexpected {token!r} (a sign must stand between two numbers)")

    value = expression(0)
    if position != len(tokens):
        raise CountdownError(f"unexpected {tokens[position]!r} after a complete expression")
    return value, numbers


def check_expression(text: str, numbers: Sequence[int], target: int, *, use_all: bool = False) -> str | None:
    """None if ``text`` reaches ``target`` using each of ``numbers`` at most once (exactly once with ``use_all``),
    else why not.

    >>> check_expression("(100 - 4) / (7 - 3)", [3, 4, 7, 100], 24)
    >>> check_expression("7 * 7 - 25", [7, 25, 30], 24)
    'uses 7 twice but it is given once'
    >>> check_expression("25 - 1", [25, 30], 24)
    'uses 1, which is not among the numbers'
    """
    try:
        value, used = evaluate(text)
    except CountdownError as e:
        return str(e)
    have, want = Counter(used), Counter(int(n) for n in numbers)
    for number, count in have.items():
        if number not in want:
            return f"uses {number}, which is not among the numbers"
        if count > want[number]:
            times = {1: "once", 2: "twice"}
            return f"uses {number} {times.get(count, f'{count} times')} but it is given {times.get(want[number], f'{want[number]} times')}"
    if use_all and have != want:
        return f"leaves out {sorted((want - have).elements())} (use_all_numbers: every number exactly once)"
    if value != target:
        return f"equals {value}, not {target}"
    return None


_LATEX_OPERATORS = (("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"), ("\\left", ""), ("\\right", ""))
_TIMES_X_RE = re.compile(r"(?<=[\d)])[ \t]*[xX][ \t]*(?=[\d(])")  # 12 x (51 - 48): a times sign
_BARE_INTEGER_RE = re.compile(r"[ \t]*[0-9]+[ \t]*")


def equation_of(answer: str) -> tuple[str, list[str]]:
    """``(expression, claimed)``: an answer's expression without markdown, LaTeX (``\\times``, ``\\div``, ``$``,
    ``\\( \\)``), Unicode minus or a closing full stop, and the values it claims after ``=`` ("(51 - 48) * 12 = 36";
    "36 = (51 - 48) * 12" reads the same).

    >>> equation_of("$(51 - 48) \\\\times 12 = 36$."), equation_of("**36 = 12 x (51 − 48)**")
    (('(51 - 48) * 12', ['36']), ('12 * (51 - 48)', ['36']))
    """
    text = decorations_removed(answer)
    for old, new in _LATEX_OPERATORS:
        text = text.replace(old, new)
    sides = [side.strip() for side in _TIMES_X_RE.sub(" * ", text).split("=")]
    if len(sides) == 2 and _BARE_INTEGER_RE.fullmatch(sides[0]) and not _BARE_INTEGER_RE.fullmatch(sides[1]):
        sides.reverse()
    return sides[0], sides[1:]


def _claim_problem(claimed: list[str], target: int) -> str | None:
    """Each value an answer claims after ``=`` must be the target (an equation that claims 35 states 35)."""
    for claim in claimed:
        try:
            value = evaluate(claim)[0]
        except CountdownError:
            return f"claims {claim[:20]!r} after '=', which is not a number"
        if value != target:
            return f"claims {claim[:20]} after '=', not the target {target}"
    return None


def grade_countdown(reply: str, task: Task, *, use_all: bool = False) -> Grade:
    """The grade of a reply: its final answer (``<answer>`` tag, else an ``Answer:`` line; :func:`equation_of`)
    checked by :func:`check_expression` against the task's numbers and target, and the one-final-answer rule
    (:func:`~gym_llm.rewards.answers.tagged_answer_problem`: no other tag with a wrong equation, no hedge, and what
    follows the tag may justify, restate or sign off but not correct it or claim another value)."""
    read = read_final_answer(reply)
    numbers, target = task.data["nums"], int(task.data["target"])
    if not read.found:
        return Grade(False, False, "", str(target), problem="no <answer>...</answer> (or 'Answer:' line) in the reply")
    expression, claimed = equation_of(read.text)
    problem = check_expression(expression, numbers, target, use_all=use_all) or _claim_problem(claimed, target)
    try:
        evaluate(expression)
        formatted = True
    except CountdownError:  # not an equation at all: no format reward
        formatted = False
    if problem is None:
        def same(other: str) -> bool:  # another tag with a correct equation is not another answer
            other_expression, other_claimed = equation_of(other)
            return check_expression(other_expression, numbers, target, use_all=use_all) is None \
                and _claim_problem(other_claimed, target) is None

        problem = tagged_answer_problem(read, Fraction(target), same)
    return Grade(problem is None, formatted, read.text, str(target), problem=problem)


# ---------------------------------------------------------------------------------------------------- tasks
def generate_countdown(size: int, seed: int, *, num_numbers: int | tuple[int, int] = (3, 4), max_number: int = 99,
                       max_target: int = 100) -> list[dict[str, Any]]:
    """``size`` solvable puzzles: ``{"nums": [...], "target": t, "solution": "..."}``.

    Numbers are drawn from ``1..max_number`` (``num_numbers`` of them, or a count in the inclusive range); the
    target is the value of a random expression that uses every number exactly once with integer intermediate
    results, kept when it lies in ``1..max_target`` — so every puzzle has a known solution (also with
    ``use_all_numbers=True``). Deterministic in its arguments; no dependency.

    >>> generate_countdown(1, 0)
    [{'nums': [51, 12, 48], 'target': 36, 'solution': '12 * (51 - 48)'}]
    """
    low, high = (num_numbers, num_numbers) if isinstance(num_numbers, int) else num_numbers
    if not 2 <= low <= high <= 8:
        raise ValueError(f"num_numbers must be an int or (low, high) within 2..8, got {num_numbers!r}.")
    if max_number < 1 or max_target < 1:
        raise ValueError(f"max_number and max_target must be >= 1, got {max_number!r}, {max_target!r}.")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"num_generated must be an int >= 1, got {size!r}.")
    rng = random.Random(seed)  # scalar draws: several times faster than numpy's per call
    out: list[dict[str, Any]] = []
    while len(out) < size:
        count = rng.randint(low, high)
        nums = [rng.randint(1, max_number) for _ in range(count)]
        # combine in a random order, as (value, text, is_sum) pairs; only integer, positive intermediate values
        items = [(n, str(n), False) for n in nums]  # ints: every intermediate value is a whole number
        while len(items) > 1:
            i, j = rng.sample(range(len(items)), 2)
            (a, ta, sa), (b, tb, sb) = items[i], items[j]
            options = [("+", a + b), ("*", a * b)]
            if a > b:
                options.append(("-", a - b))
            if b > 1 and a % b == 0:
                options.append(("/", a // b))
            op, value = options[rng.randrange(len(options))]
            left = f"({ta})" if sa and op in "*/" else ta
            right = f"({tb})" if (sb and op != "+") or (op == "/" and any(c in tb for c in "*/")) else tb
            items = [item for k, item in enumerate(items) if k not in (i, j)] + [(value, f"{left} {op} {right}",
                                                                                   op in "+-")]
        value, text, _ = items[0]
        if 1 <= value <= max_target:
            out.append({"nums": nums, "target": value, "solution": text})
    return out


@functools.lru_cache(maxsize=8)
def _generated(size: int, seed: int, num_numbers: Any, max_number: int, max_target: int) -> tuple[dict[str, Any], ...]:
    """:func:`generate_countdown`, once per process per settings (every sub-env and every env made again with the
    same arguments reads the same puzzles; they are copied into each task)."""
    return tuple(generate_countdown(size, seed, num_numbers=num_numbers, max_number=max_number, max_target=max_target))


CountdownSource = Literal["generated", "file", "hub"]


def load_countdown_tasks(*, data_files: Any = None, tasks: Any = None, source: CountdownSource | None = None,
                         dataset_name: str = "Jiayi-Pan/Countdown-Tasks-3to4", split: str = "train",
                         num_generated: int = 1_000, generator_seed: int = 0, num_numbers: int | tuple[int, int] = (3, 4),
                         max_number: int = 99, max_target: int = 100,
                         prompt_template: str = DEFAULT_COUNTDOWN_PROMPT) -> list[Task]:
    """Countdown tasks: records with ``nums`` (a list of ints) and ``target`` (an int) — TinyZero's columns — from
    ``tasks=`` (records or a ``datasets.Dataset``), ``data_files=`` (``.parquet``/``.jsonl``, e.g. TinyZero's
    ``train.parquet``), the hub (``source="hub"``: ``dataset_name``), else generated (:func:`generate_countdown`).

    Raises:
        ValueError: a record without ``nums``/``target``, naming its index; a template without the fields.
    """
    if "{numbers}" not in prompt_template or "{target}" not in prompt_template:
        raise ValueError(f"prompt_template must contain '{{numbers}}' and '{{target}}', got {prompt_template!r}.")
    records = records_from_source(
        tasks=tasks, data_files=data_files, source=source, split=split, default="generated",
        file_hint="TinyZero's .parquet, or a .jsonl with nums/target",
        sources={"generated": lambda: _generated(num_generated, generator_seed, num_numbers if isinstance(
                     num_numbers, int) else tuple(num_numbers), max_number, max_target),
                 "hub": lambda: load_hub_dataset(dataset_name, None, split)})
    out = []
    for index, record in enumerate(records):
        nums = record.get("nums") if isinstance(record, dict) else None
        target = record.get("target") if isinstance(record, dict) else None
        try:
            nums = [int(n) for n in nums]
            ok = bool(nums) and all(n >= 0 for n in nums) and int(target) == target
        except (TypeError, ValueError):
            ok = False
        if not ok:
            got = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(f"Countdown record {index} needs 'nums' (a list of whole numbers) and 'target' (a whole "
                             f"number), got {got}; e.g. {{'nums': [3, 4, 7, 100], 'target': 24}}.")
        prompt = prompt_template.format(numbers=", ".join(map(str, nums)), target=int(target))
        out.append(Task(index, (Message("user", prompt),), str(int(target)), {**record, "nums": nums,
                                                                               "target": int(target)}))
    return out


# ------------------------------------------------------------------------------------------------------ env
@with_arguments_of(load_countdown_tasks, scored_reply_parts)
def build_countdown(*, use_all_numbers: bool = False, **kwargs: Any) -> EnvParts:
    """The env's parts: :func:`load_countdown_tasks`'s arguments pick the tasks; ``use_all_numbers`` (TinyZero's rule:
    every number exactly once); the rest (``format_reward``, ``reward_fn``, tools, every ``ChatConfig`` field) go to
    :func:`~gym_llm.envs.scored.scored_reply_parts`."""
    task_list = load_countdown_tasks(**take_arguments(load_countdown_tasks, kwargs))
    return scored_reply_parts(task_list, functools.partial(grade_countdown, use_all=bool(use_all_numbers)), **kwargs)


class LLMCountdownEnv(LLMEnv, build=build_countdown):
    """Countdown: combine the given numbers with + - * / to reach the target (TinyZero's task).

    ## Description
    One puzzle per episode; the policy answers once with an equation in ``<answer> </answer>`` tags (an
    ``Answer:`` line is read too). The equation is parsed by a small exact parser — no ``eval`` — and computed with
    rationals: it must use only the given numbers, each at most once (exactly once with ``use_all_numbers=True``,
    TinyZero's rule), and equal the target.

    ## Action Space
    Text mode: ``UnicodeText(max_action_chars)``; tokens mode: padded ids + mask (see ``LLMChat-v0``).

    ## Observation Space
    The puzzle rendered with the chat template (text), or its token ids (tokens mode).

    ## Rewards
    | outcome | reward |
    |---|---|
    | the equation is valid and equals the target | 1.0 |
    | otherwise | 0.0 |
    | plus, if the answer parses as an equation | ``format_reward`` (default 0.0) |
    | plus, if given | ``reward_fn(task, messages)`` (shaping, under ``reward_timeout_s``) |

    ``info``: ``correct``, ``formatted``, ``extracted_answer`` (the equation), ``reference_answer`` (the target),
    ``answer_problem`` (why it was refused: a number used twice, a wrong value, a character that is not arithmetic).

    ## Starting State
    The next puzzle of the task stream (seeded shuffle; ``options={"task_id": i}`` forces one).
    ``task.data["solution"]`` holds a known solution for generated puzzles.

    ## Episode End
    Terminated after the one assistant turn.

    ## Arguments
    * Task source: ``tasks`` (records/``datasets.Dataset`` with ``nums``/``target``), ``data_files`` (TinyZero's
      ``.parquet`` or a ``.jsonl``), ``source="hub"`` (``dataset_name``, ``split``), else generated offline:
      ``num_generated``, ``generator_seed``, ``num_numbers`` (an int or an inclusive range, default 3–4),
      ``max_number`` (99), ``max_target`` (100).
    * ``use_all_numbers``, ``prompt_template`` (with ``{numbers}`` and ``{target}``), ``format_reward``,
      ``reward_fn``, ``reward_timeout_s``, ``task_order``, tools, and every ``ChatConfig`` field (``mode``,
      ``tokenizer``, ``system_prompt``, ...).

    ## Vectorized environment
    ``gym.make_vec("LLMCountdown-v0", num_envs=8, group_size=4)`` (:class:`LLMCountdownVectorEnv`, derived).

    ## Version History
    * v0: initial version.
    * v0, reward change (issue 45): the equation is read without markdown, ``$``/``\\( \\)``, ``\\times``/``\\div``,
      Unicode minus or a closing full stop, ``target = expr`` reads as ``expr = target``, and a value claimed after
      ``=`` must be the target; another tag with a wrong equation, a hedge, or a correction or other value after the
      tag makes the reply wrong; tags before ``</think>`` are not read. The id stays ``-v0`` (see ``LLMGSM8K-v0``).
    """
