"""False negatives and false positives of answer rules, per class, on the labelled corpus of each scored env
(``tests/data/answer_corpus``): gym-llm's rule beside the graders people use instead. The tables of
docs/verifiers.md ("Precision and recall on a labelled corpus") are this script's output.

    python -m scripts.answer_recall --batch all      # every env, both batches of endings (from the repository root)
    python -m scripts.answer_recall --env countdown --misses   # one env, and gym-llm's errors

A *correct* class (the reply states one right answer) shows the false-negative rate: refused / replies; a *wrong*
class (no single answer, or a wrong one) the false-positive rate: paid / replies. The graders:

* **gym-llm** — the env's own grade: :func:`gym_llm.rewards.gsm8k.grade` (``LLMGSM8K-v0``, ``LLMPythonTool-v0``),
  :func:`gym_llm.envs.countdown.grade_countdown`, ``LLMReasoningGym-v0``'s grade with the dataset's scorer in-process;
* **lm-eval strict / flexible** — ``lm_eval/tasks/gsm8k/gsm8k.yaml`` (lm-eval 0.4.13): *strict-match* takes the first
  ``#### (\\-?[0-9\\.\\,]+)``, *flexible-extract* the last match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)``, both through
  lm-eval's ``RegexFilter`` rules (first non-empty group, stripped, ``[invalid]`` when none) and then ``exact_match``
  with its ``regexes_to_ignore`` (``,``, ``\\$``, ``(?s).*#### ``, ``\\.$``) and ``ignore_case``. For Countdown and
  reasoning-gym only *flexible* applies (no ``####``): the last number, the common "last number in the reply" rule;
* **math-verify** — ``math_verify.verify(parse(reference), parse(reply))`` on the whole reply (its default extraction:
  the last LaTeX or plain expression, ``\\boxed{}`` first);
* **TinyZero** (Countdown) — TinyZero's ``countdown.compute_score`` rules, re-implemented: the reply after
  ``Assistant:``, its last line's last ``<answer>...</answer>``, every given number used exactly once, only digits,
  ``+-*/()`` and spaces, equal to the target (the reply is passed as ``"Assistant: " + reply``);
* **reasoning-gym** — the library's own ``extract_answer`` (last ``<answer>`` tag) and the dataset's ``score_answer``
  (paid when it scores 1.0).
"""

from __future__ import annotations

import argparse
import ast
import functools
import operator
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from tests.data.answer_corpus import CORRECT_CLASSES, ENVS, WRONG_CLASSES, Item, build

STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORED = (",", r"\$", r"(?s).*#### ", r"\.$")


def lm_eval_filter(pattern: re.Pattern, reply: str, group_select: int) -> str:
    """lm-eval's ``RegexFilter.apply`` on one reply: the selected match, its first non-empty group, stripped."""
    found = pattern.findall(reply)
    if not found:
        return "[invalid]"
    match = found[group_select]
    if isinstance(match, tuple):
        match = next((m for m in match if m), "[invalid]")
    return match.strip()


def lm_eval_exact_match(prediction: str, reference: str) -> bool:
    """lm-eval's ``exact_match`` with gsm8k.yaml's ``regexes_to_ignore`` and ``ignore_case``."""
    for pattern in _IGNORED:
        prediction, reference = re.sub(pattern, "", prediction), re.sub(pattern, "", reference)
    return prediction.lower() == reference.lower()


def lm_eval_strict(item: Item) -> bool:
    return lm_eval_exact_match(lm_eval_filter(STRICT_RE, item.reply, 0), item.reference)


def lm_eval_flexible(item: Item) -> bool:
    return lm_eval_exact_match(lm_eval_filter(FLEXIBLE_RE, item.reply, -1), item.reference)


def math_verify_alone(item: Item) -> bool:
    from math_verify import parse, verify

    try:
        return bool(verify(parse(item.reference), parse(item.reply)))
    except Exception:
        return False


def gym_llm_gsm8k(item: Item) -> bool:
    from gym_llm.rewards.gsm8k import grade

    return grade(item.reply, item.reference).correct


def gym_llm_countdown(item: Item) -> bool:
    from gym_llm.core.tasks import Task
    from gym_llm.envs.countdown import grade_countdown

    return grade_countdown(item.reply, Task(0, (), item.reference, dict(item.task))).correct


def gym_llm_reasoning_gym(item: Item) -> bool:
    from gym_llm.core.tasks import Task
    from gym_llm.envs.reasoning_gym import _grade, score_entry

    scorer = functools.partial(score_entry, item.task["dataset"], "{}")
    return _grade(item.reply, Task(0, (), item.reference, dict(item.task)), scorer=scorer).correct


def reasoning_gym_own(item: Item) -> bool:
    from reasoning_gym.utils import extract_answer

    from gym_llm.envs.reasoning_gym import score_entry

    return score_entry(item.task["dataset"], "{}", extract_answer(item.reply), item.task["entry"]) >= 1.0


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _tinyzero_eval(node: ast.AST) -> float:
    """What ``eval`` computes on TinyZero's allowed characters (numbers, + - * / and parentheses), without eval."""
    if isinstance(node, ast.Expression):
        return _tinyzero_eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_tinyzero_eval(node.left), _tinyzero_eval(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _tinyzero_eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError("not arithmetic")


def tinyzero(item: Item) -> bool:
    solution = ("Assistant: " + item.reply).split("Assistant:", 1)[1].split("\n")[-1]
    matches = re.findall(r"<answer>(.*?)</answer>", solution)
    if not matches:
        return False
    equation = matches[-1].strip()
    if sorted(int(n) for n in re.findall(r"\d+", equation)) != sorted(item.task["nums"]):
        return False
    if not re.match(r"^[\d+\-*/().\s]+$", equation):
        return False
    try:
        return abs(_tinyzero_eval(ast.parse(equation, mode="eval")) - item.task["target"]) < 1e-5
    except (ValueError, SyntaxError, ZeroDivisionError, TypeError):
        return False


GRADERS: dict[str, dict[str, Callable[[Item], bool]]] = {
    "gsm8k": {"gym-llm": gym_llm_gsm8k, "lm-eval strict": lm_eval_strict, "lm-eval flexible": lm_eval_flexible,
              "math-verify": math_verify_alone},
    "countdown": {"gym-llm": gym_llm_countdown, "TinyZero": tinyzero,
                  "last number (lm-eval flexible)": lm_eval_flexible, "math-verify": math_verify_alone},
    "reasoning_gym": {"gym-llm": gym_llm_reasoning_gym, "reasoning-gym": reasoning_gym_own,
                      "last number (lm-eval flexible)": lm_eval_flexible, "math-verify": math_verify_alone},
}
GRADERS["python_tool"] = GRADERS["gsm8k"]


@dataclass(frozen=True)
class Rates:
    """Per grader and class: (errors, replies); errors are refusals in correct classes, payments in wrong ones."""

    env: str
    counts: dict[str, dict[str, tuple[int, int]]]
    misses: dict[str, list[Item]]  # gym-llm's errors, to read

    def rate(self, grader: str, cls: str) -> float:
        errors, total = self.counts[grader][cls]
        return errors / total

    def overall(self, grader: str, kind: str) -> float:
        classes = CORRECT_CLASSES[self.env] if kind == "FN" else WRONG_CLASSES[self.env]
        errors = sum(self.counts[grader][c][0] for c in classes)
        return errors / sum(self.counts[grader][c][1] for c in classes)


def rates(env: str, items: list[Item] | None = None, *, batch: str = "all") -> Rates:
    """Every grader of ``env`` on ``items`` (default: the corpus of ``batch``: "dev", "heldout" or "all")."""
    if items is None:
        items = [i for b in (("dev", "heldout") if batch == "all" else (batch,)) for i in build(env, batch=b)]
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    misses: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        for name, grader in GRADERS[env].items():
            paid = grader(item)
            cell = counts[name][item.cls]
            cell[0] += int(paid != item.correct)
            cell[1] += 1
            if name == "gym-llm" and paid != item.correct:
                misses[item.cls].append(item)
    return Rates(env, {g: {c: tuple(v) for c, v in per.items()} for g, per in counts.items()}, dict(misses))


def table(result: Rates) -> str:
    graders = list(GRADERS[result.env])
    lines = [f"| class | rate | {' | '.join(graders)} |", "|---|---|" + "---:|" * len(graders)]

    def cell(errors: int, total: int) -> str:
        return f"{errors}/{total} ({100 * errors / total:.1f}%)"

    for kind, classes in (("FN", CORRECT_CLASSES[result.env]), ("FP", WRONG_CLASSES[result.env])):
        for cls in classes:
            lines.append(f"| {cls} | {kind} | " + " | ".join(cell(*result.counts[g][cls]) for g in graders) + " |")
        totals = [(sum(result.counts[g][c][0] for c in classes), sum(result.counts[g][c][1] for c in classes))
                  for g in graders]
        lines.append(f"| **all {'correct' if kind == 'FN' else 'wrong'}** | **{kind}** | "
                     + " | ".join(f"**{cell(*t)}**" for t in totals) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=ENVS, action="append", help="an env (repeatable; default: all)")
    parser.add_argument("--batch", choices=("dev", "heldout", "all"), default="all",
                        help="the corpus's endings: the first batch, the second (written after the rule was tuned on "
                             "the first; see heldout_endings.py), or both")
    parser.add_argument("--misses", action="store_true", help="also print gym-llm's errors")
    args = parser.parse_args()
    for env in args.env or ENVS:
        result = rates(env, batch=args.batch)
        print(f"\n### {env} ({sum(t for _, t in result.counts['gym-llm'].values())} replies)\n")
        print(table(result))
        if args.misses:
            for cls, items in result.misses.items():
                for item in items:
                    print(f"\n--- {cls} (label {'correct' if item.correct else 'wrong'}, reference {item.reference})\n"
                          f"{item.reply[-300:]}")


if __name__ == "__main__":
    main()
