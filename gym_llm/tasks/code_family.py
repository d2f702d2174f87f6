"""``LLMCode-v0``'s ``source="basic"``: a generated family of small Python function tasks, for learning runs.

HumanEval is an evaluation set, and too hard for a 135M-parameter model to learn from (SmolLM2-135M-Instruct passes
almost none of it, so GRPO sees no reward). This family is the same shape — a signature and a docstring with two
examples; hidden ``check(candidate)`` asserts — at the difficulty of one line of code: arithmetic on an argument,
list and string basics, each with its own constants (``add_17``, ``keep_greater_than_4``, ``count_char_e``).

A task is one template with its constants; ``split`` holds out whole (template, constants) pairs: a pair is a test
task when the CRC-32 of its name is divisible by 5 (about a fifth), so a test task's function never appears in
training, though its template does. Each task's hidden tests are five inputs drawn apart from the docstring's two
examples, so echoing the examples fails. Everything is generated from ``seed``: the same arguments give the same
tasks, tests and reference solutions on any machine.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from random import Random
from typing import Any, Callable

from gym_llm.core.tasks import Task
from gym_llm.envs.code_tasks import _HUMANEVAL_TEMPLATE, CodeProblem, _task as make_task

__all__ = ["TEMPLATES", "Template", "load_basic_tasks"]

_WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "paper", "house", "green", "music", "ocean", "night")
_LETTERS = "aeiorstn"
_SEPARATORS = (("dash", "-"), ("comma", ","), ("plus", "+"), ("dot", "."), ("colon", ":"), ("slash", "/"))


def _ints(rng: Random, n: int = 6, lo: int = -20, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(1, n))]


def _word(rng: Random) -> str:
    return rng.choice(_WORDS) + rng.choice(("", "s", "y", "er")) if rng.random() < 0.7 else \
        "".join(rng.choice("abcdeilmnorst") for _ in range(rng.randint(1, 8)))


@dataclass(frozen=True)
class Template:
    """One kind of task. ``name``/``doc``/``body`` are formatted with the task's constants."""

    name: str
    signature: str
    doc: str
    body: str
    constants: Callable[[Random], dict[str, Any]]
    inputs: Callable[[Random, dict[str, Any]], tuple]
    solve: Callable[..., Any]  # solve(constants, *args): the reference, to compute the expected outputs


TEMPLATES: tuple[Template, ...] = (
    Template("add_{k}", "(x: int) -> int", "Return x plus {k}.", "return x + {k}",
             lambda r: {"k": r.randint(2, 99)}, lambda r, c: (r.randint(-100, 100),), lambda c, x: x + c["k"]),
    Template("subtract_{k}", "(x: int) -> int", "Return x minus {k}.", "return x - {k}",
             lambda r: {"k": r.randint(2, 99)}, lambda r, c: (r.randint(-100, 100),), lambda c, x: x - c["k"]),
    Template("times_{k}", "(x: int) -> int", "Return x multiplied by {k}.", "return x * {k}",
             lambda r: {"k": r.randint(2, 30)}, lambda r, c: (r.randint(-50, 50),), lambda c, x: x * c["k"]),
    Template("is_multiple_of_{k}", "(x: int) -> bool", "Return True if x is divisible by {k}, else False.",
             "return x % {k} == 0", lambda r: {"k": r.randint(2, 12)},
             lambda r, c: (r.randint(-10, 10) * c["k"] + r.choice((0, 0, 1, 2)),), lambda c, x: x % c["k"] == 0),
    Template("power_{k}", "(x: int) -> int", "Return x raised to the power {k}.", "return x ** {k}",
             lambda r: {"k": r.randint(2, 5)}, lambda r, c: (r.randint(-9, 9),), lambda c, x: x ** c["k"]),
    Template("sum_list_plus_{k}", "(xs: list) -> int", "Return the sum of the numbers in xs, plus {k}.",
             "return sum(xs) + {k}", lambda r: {"k": r.randint(0, 50)}, lambda r, c: (_ints(r),),
             lambda c, xs: sum(xs) + c["k"]),
    Template("largest_times_{k}", "(xs: list) -> int", "Return the largest number in the non-empty list xs, "
             "multiplied by {k}.", "return max(xs) * {k}", lambda r: {"k": r.randint(1, 9)},
             lambda r, c: (_ints(r),), lambda c, xs: max(xs) * c["k"]),
    Template("smallest_plus_{k}", "(xs: list) -> int", "Return the smallest number in the non-empty list xs, plus "
             "{k}.", "return min(xs) + {k}", lambda r: {"k": r.randint(1, 40)}, lambda r, c: (_ints(r),),
             lambda c, xs: min(xs) + c["k"]),
    Template("count_{k}", "(xs: list) -> int", "Return how many times the number {k} appears in xs.",
             "return xs.count({k})", lambda r: {"k": r.randint(0, 5)},
             lambda r, c: ([r.randint(0, 5) for _ in range(r.randint(0, 9))],), lambda c, xs: xs.count(c["k"])),
    Template("first_{k}_items", "(xs: list) -> list", "Return a list of the first {k} items of xs (all of them if "
             "xs is shorter).", "return xs[:{k}]", lambda r: {"k": r.randint(1, 6)},
             lambda r, c: (_ints(r, 9),), lambda c, xs: xs[:c["k"]]),
    Template("keep_greater_than_{k}", "(xs: list) -> list", "Return a list of the numbers of xs that are greater than "
             "{k}, in their order.", "return [x for x in xs if x > {k}]", lambda r: {"k": r.randint(0, 10)},
             lambda r, c: (_ints(r, 9),), lambda c, xs: [x for x in xs if x > c["k"]]),
    Template("add_{k}_to_each", "(xs: list) -> list", "Return a list with {k} added to each number of xs.",
             "return [x + {k} for x in xs]", lambda r: {"k": r.randint(1, 20)}, lambda r, c: (_ints(r),),
             lambda c, xs: [x + c["k"] for x in xs]),
    Template("squares", "(xs: list) -> list", "Return a list of the squares of the numbers in xs.",
             "return [x * x for x in xs]", lambda r: {}, lambda r, c: (_ints(r),), lambda c, xs: [x * x for x in xs]),
    Template("even_numbers", "(xs: list) -> list", "Return a list of the even numbers of xs, in their order.",
             "return [x for x in xs if x % 2 == 0]", lambda r: {}, lambda r, c: (_ints(r, 9),),
             lambda c, xs: [x for x in xs if x % 2 == 0]),
    Template("repeat_{k}_times", "(s: str) -> str", "Return the string s repeated {k} times.", "return s * {k}",
             lambda r: {"k": r.randint(2, 5)}, lambda r, c: (_word(r),), lambda c, s: s * c["k"]),
    Template("reverse_and_add_{suffix}", "(s: str) -> str", "Return the string s reversed, followed by '{suffix}'.",
             "return s[::-1] + '{suffix}'", lambda r: {"suffix": r.choice(("x", "ab", "zz", "end", "q", "ok"))},
             lambda r, c: (_word(r),), lambda c, s: s[::-1] + c["suffix"]),
    Template("count_char_{c}", "(s: str) -> int", "Return how many times the letter '{c}' occurs in s.",
             "return s.count('{c}')", lambda r: {"c": r.choice(_LETTERS)}, lambda r, c: (_word(r),),
             lambda c, s: s.count(c["c"])),
    Template("starts_with_{c}", "(s: str) -> bool", "Return True if s starts with the letter '{c}', else False.",
             "return s.startswith('{c}')", lambda r: {"c": r.choice(_LETTERS)},
             lambda r, c: (c["c"] + _word(r) if r.random() < 0.4 else _word(r),), lambda c, s: s.startswith(c["c"])),
    Template("length_plus_{k}", "(s: str) -> int", "Return the number of characters in s, plus {k}.",
             "return len(s) + {k}", lambda r: {"k": r.randint(1, 30)}, lambda r, c: (_word(r),),
             lambda c, s: len(s) + c["k"]),
    Template("join_with_{name}", "(words: list) -> str", "Return the strings of words joined with '{sep}' between "
             "them.", "return '{sep}'.join(words)",
             lambda r: dict(zip(("name", "sep"), r.choice(_SEPARATORS))),
             lambda r, c: ([_word(r) for _ in range(r.randint(0, 4))],), lambda c, w: c["sep"].join(w)),
    Template("absolute_difference_plus_{k}", "(a: int, b: int) -> int", "Return the absolute difference of a and b, "
             "plus {k}.", "return abs(a - b) + {k}", lambda r: {"k": r.randint(0, 20)},
             lambda r, c: (r.randint(-50, 50), r.randint(-50, 50)), lambda c, a, b: abs(a - b) + c["k"]),
    Template("clamp_{lo}_to_{hi}", "(x: int) -> int", "Return x if it is between {lo} and {hi}; return {lo} if x is "
             "smaller and {hi} if x is larger.", "return min(max(x, {lo}), {hi})",
             lambda r: (lambda lo: {"lo": lo, "hi": lo + r.randint(1, 20)})(r.randint(0, 10)),
             lambda r, c: (r.randint(c["lo"] - 15, c["hi"] + 15),), lambda c, x: min(max(x, c["lo"]), c["hi"])),
    Template("largest_of_three_plus_{k}", "(a: int, b: int, c: int) -> int", "Return the largest of a, b and c, plus "
             "{k}.", "return max(a, b, c) + {k}", lambda r: {"k": r.randint(0, 9)},
             lambda r, c: tuple(r.randint(-30, 30) for _ in range(3)), lambda c, a, b, d: max(a, b, d) + c["k"]),
    Template("is_palindrome", "(s: str) -> bool", "Return True if s reads the same forwards and backwards, else "
             "False.", "return s == s[::-1]", lambda r: {},
             lambda r, c: ((lambda w: w + w[::-1][r.randint(0, 1):])(_word(r)) if r.random() < 0.5 else _word(r),),
             lambda c, s: s == s[::-1]),
)
"""The family's templates: arithmetic, predicates, list and string basics."""


def _key(template: Template, constants: dict[str, Any]) -> str:
    return template.name.format(**constants)


def _is_test(name: str) -> bool:
    return zlib.crc32(name.encode()) % 5 == 0


def _inputs(rng: Random, template: Template, constants: dict[str, Any], count: int) -> list[tuple]:
    """``count`` distinct inputs (fewer when the template's input space is smaller)."""
    seen: list[tuple] = []
    for _ in range(count * 20):
        args = template.inputs(rng, constants)
        if args not in seen:
            seen.append(args)
        if len(seen) == count:
            break
    return seen


def _stub(template: Template, constants: dict[str, Any], examples: list[tuple]) -> tuple[str, str]:
    name = template.name.format(**constants)
    lines = [f"def {name}{template.signature}:", f'    """{template.doc.format(**constants)}']
    for args in examples:
        lines += [f"    >>> {name}({', '.join(map(repr, args))})", f"    {template.solve(constants, *args)!r}"]
    return name, "\n".join(lines) + '\n    """\n'


def _task(index: int, rng: Random, template: Template, constants: dict[str, Any]) -> Task:
    cases = _inputs(rng, template, constants, 7)
    examples, hidden = cases[:2], cases[2:]
    name, stub = _stub(template, constants, examples)
    asserts = "".join(f"    assert candidate({', '.join(map(repr, args))}) == "
                      f"{template.solve(constants, *args)!r}\n" for args in hidden)
    problem = CodeProblem("asserts", f"basic/{name}", entry_point=name, code_prompt=stub,
                          tests=f"def check(candidate):\n{asserts}",
                          solution=stub + "    " + template.body.format(**constants) + "\n")
    return make_task(index, _HUMANEVAL_TEMPLATE.format(prompt=stub), problem)


def load_basic_tasks(split: str = "train", *, size: int = 1_000, seed: int = 0) -> list[Task]:
    """``size`` tasks of the family in ``split`` (``"train"``, ``"test"`` or ``"all"``), generated from ``seed``.

    A (template, constants) pair may come back in several tasks, each with its own hidden inputs.

    >>> tasks = load_basic_tasks("test", size=3, seed=0)
    >>> [t.data["source_id"] for t in tasks]
    ['basic/even_numbers', 'basic/largest_times_7', 'basic/subtract_79']
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an int >= 1, got {size!r}.")
    rng = Random(f"gym_llm basic code tasks {seed}")
    tasks: list[Task] = []
    while len(tasks) < size:
        template = rng.choice(TEMPLATES)
        constants = template.constants(rng)
        if split != "all" and _is_test(_key(template, constants)) != (split == "test"):
            continue
        tasks.append(_task(len(tasks), rng, template, constants))
    return tasks
