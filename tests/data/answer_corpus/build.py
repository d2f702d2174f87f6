"""The corpus builder (see the package docstring): real solutions and puzzles, closed by endings of each class."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from gym_llm.rewards.number_text import CALCULATOR_RE, NUMBER_RE, to_fraction
from tests.data.answer_corpus import gsm8k_endings as G
from tests.data.answer_corpus import heldout_endings as H
from tests.data.answer_corpus import tag_endings as T

ENVS = ("gsm8k", "python_tool", "countdown", "reasoning_gym")
CORRECT_CLASSES = {
    "gsm8k": ("plain", "sign_off", "justification", "restatement", "units", "question", "no_marker"),
    "python_tool": ("plain", "sign_off", "justification", "restatement", "question"),
    "countdown": ("plain", "format", "sign_off", "justification", "restatement", "question"),
    "reasoning_gym": ("plain", "format", "sign_off", "justification", "restatement", "question"),
}
WRONG_CLASSES = {env: (("wrong_value",) if env != "python_tool" else ()) + (
    "alternative", "hedge", "correction", "two_answers", "contradiction") for env in ENVS}
PER_CLASS = {"gsm8k": 72, "python_tool": 36, "countdown": 60, "reasoning_gym": 60}
DATA = Path(__file__).resolve().parents[1]
_GSM8K_TEMPLATES = {"plain": G.PLAIN, "sign_off": G.SIGN_OFF, "justification": G.JUSTIFICATION,
                    "restatement": G.RESTATEMENT, "units": G.UNITS, "question": G.QUESTION, "no_marker": G.NO_MARKER,
                    "alternative": G.ALTERNATIVE, "hedge": G.HEDGE, "correction": G.CORRECTION,
                    "two_answers": G.TWO_ANSWERS, "contradiction": G.CONTRADICTION,
                    "wrong_value": G.PLAIN + G.SIGN_OFF + G.JUSTIFICATION + G.QUESTION}
_NOT_UNITS = {"and", "per", "a", "an", "the", "in", "to", "for", "each", "every", "of", "is", "was", "on", "at", "from",
              "with", "so", "this", "that", "if", "more", "less", "left", "total", "altogether", "now", "he", "she",
              "they", "it", "than", "by", "after", "before", "as", "or", "but", "which", "will", "would", "can"}
_LOWER_FIRST = {"The", "She", "He", "They", "It", "So", "Then", "This", "There", "We", "In", "If", "Each", "A", "An",
                "For", "That", "His", "Her", "Their", "There's", "Since", "After", "Now", "Together", "Altogether"}


@dataclass(frozen=True)
class Item:
    """One labelled reply: ``correct`` is the label (it states one answer, equal to ``reference``)."""

    env: str
    cls: str
    correct: bool
    reply: str
    reference: str
    source: str
    task: dict[str, Any] | None = field(default=None, compare=False)


BATCHES = ("dev", "heldout")


def build(env: str, data_dir: Path | str | None = None, *, batch: str = "dev") -> list[Item]:
    """The corpus of ``env`` (one of :data:`ENVS`) with the endings of ``batch`` ("dev": the templates the rule was
    tuned on; "heldout": :mod:`.heldout_endings`); GSM8K's train split is read from ``data_dir/gsm8k``."""
    if batch not in BATCHES:
        raise ValueError(f"batch must be one of {BATCHES}, got {batch!r}.")
    if env in ("gsm8k", "python_tool"):
        return _gsm8k(env, Path(data_dir) if data_dir else _shared_data(), batch)
    return _countdown(batch) if env == "countdown" else _reasoning_gym(batch)


def _shared_data() -> Path:
    from tests.conftest import shared_data_dir

    return shared_data_dir()


# -------------------------------------------------------------------------------------------------- GSM8K
@dataclass(frozen=True)
class _Solution:
    lines: tuple[str, ...]  # the work, without its answer line
    answer: str  # the answer the solution reaches
    reference: str
    correct: bool
    source: str


def _solutions(data_dir: Path) -> list[_Solution]:
    out = []
    train = (data_dir / "gsm8k" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    for index in range(0, len(train), 47):
        row = json.loads(train[index])
        work, _, answer = CALCULATOR_RE.sub("", row["answer"]).rpartition("\n####")
        answer = answer.strip().replace(",", "")
        out.append(_Solution(tuple(work.strip().splitlines()), answer, answer, True, f"gsm8k/train.jsonl:{index}"))
    for name in ("gsm8k_model_solutions.jsonl", "gsm8k_model_solutions_more.jsonl"):
        for line in (DATA / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            work, sep, answer = CALCULATOR_RE.sub("", row["solution"]).rpartition("\nA: ")
            if sep and NUMBER_RE.fullmatch(answer.strip().replace(",", "")):
                out.append(_Solution(tuple(work.strip().splitlines()), answer.strip().replace(",", ""),
                                     row["reference"], row["is_correct"], row["source"]))
    return out


def _fields(solution: _Solution, other_first: bool) -> dict[str, str]:
    a, lines = solution.answer, solution.lines
    body_numbers = [n for line in lines for n in NUMBER_RE.findall(line)]
    others = [n.replace(",", "") for n in body_numbers if to_fraction(n) != to_fraction(a)]
    y = others[-1] if others else str(int(Fraction(a)) + 1 if Fraction(a).denominator == 1 else Fraction(a) + 1)
    last = lines[-1].strip() if lines else ""
    steps = [line for line in lines[:-1] if "=" in line and a not in NUMBER_RE.findall(line)] or list(lines[:1])
    why = steps[-1].strip().rstrip(".") if steps else "the steps above add up"
    first = why.split(" ", 1)[0]
    why = why[0].lower() + why[1:] if first in _LOWER_FIRST else why
    unit = re.search(rf"(?<![\d.]){re.escape(a)}\s+([a-z]+)", last)
    word = unit.group(1) if unit and unit.group(1) not in _NOT_UNITS else ""
    restate = last if last.endswith((".", "!", "?")) else last + "."
    x, y = (y, a) if other_first else (a, y)
    lower = restate[0].lower() + restate[1:] if restate.split(" ", 1)[0] in _LOWER_FIRST else restate
    return {"a": a, "x": x, "y": y, "why": why, "restate": restate, "restate_lc": lower,
            "restate_y": _replace_last(restate, a, y if x == a else a),
            "cur": "$" if re.search(rf"\$\s?{re.escape(a)}(?![\d])", last) else "", "unit": f" {word}" if word else "",
            "unit_word": word or "total", "restates": str(a in NUMBER_RE.findall(last))}


def _replace_last(sentence: str, number: str, new: str) -> str:
    """``sentence`` with its last ``number`` (the result it states) replaced by ``new``."""
    found = list(re.finditer(rf"(?<![\d.]){re.escape(number)}(?![\d])", sentence))
    return sentence if not found else sentence[:found[-1].start()] + new + sentence[found[-1].end():]


def _usable(template: str, fields: dict[str, str]) -> bool:
    if "{restate" in template and fields["restates"] != "True":
        return False  # the solution's last sentence does not state the answer
    if (".00" in template or ".0" in template) and not fields["a"].isdigit():
        return False
    return True


def _gsm8k_templates(env: str, cls: str, batch: str) -> list[str]:
    if batch == "heldout":
        if cls == "wrong_value":
            return H.GSM8K["plain"] + H.GSM8K["sign_off"] + H.GSM8K["justification"] + H.GSM8K["question"]
        return H.GSM8K[cls]
    return G.TOOL[cls] if env == "python_tool" else _GSM8K_TEMPLATES[cls]


def _gsm8k(env: str, data_dir: Path, batch: str) -> list[Item]:
    solutions = _solutions(data_dir)
    right = [s for s in solutions if s.correct]
    wrong = [s for s in solutions if not s.correct and s.answer != s.reference]
    items = []
    for cls in CORRECT_CLASSES[env] + WRONG_CLASSES[env]:
        templates = _gsm8k_templates(env, cls, batch)
        pool = wrong if cls == "wrong_value" else right
        rng = random.Random(f"{env}:{cls}:{batch}")
        for i in range(PER_CLASS[env]):
            template = None
            while template is None:  # a solution whose last sentence states its answer, where the ending needs one
                solution = rng.choice(pool)
                fields = _fields(solution, other_first=i % 2 == 1)
                usable = [t for k in range(len(templates)) if _usable(t := templates[(i + k) % len(templates)], fields)]
                template = usable[0] if usable else None
            if "{y}" not in template and cls in WRONG_CLASSES[env]:
                fields = _fields(solution, other_first=False)  # a hedge of the right answer alone
            ending = template.format(**fields)
            if env == "python_tool":
                run = fields["a"] + (".0" if i % 3 == 0 and fields["a"].isdigit() else "")
                lead = rng.choice(G.TOOL_BODIES).format(a_run=run)
                reply = f"{lead}\n{ending}" if "{restate}" in template else f"{lead} {fields['restate']}\n\n{ending}"
            else:
                work = solution.lines[:-1] if "{restate}" in template else solution.lines
                reply = "\n".join(work) + "\n" + ending
            correct = cls in CORRECT_CLASSES[env] and solution.correct
            items.append(Item(env, cls, correct, reply, solution.reference, solution.source))
    return items


# ---------------------------------------------------------------------------------------------- Countdown
def _countdown(batch: str) -> list[Item]:
    from gym_llm.envs.countdown import check_expression, evaluate, generate_countdown

    puzzles = generate_countdown(300, 45)
    items = []
    for cls in CORRECT_CLASSES["countdown"] + WRONG_CLASSES["countdown"]:
        templates = (H.COUNTDOWN if batch == "heldout" else T.COUNTDOWN)[cls]
        rng = random.Random(f"countdown:{cls}:{batch}")
        for i in range(PER_CLASS["countdown"]):
            puzzle = rng.choice(puzzles)
            e, nums, t = puzzle["solution"], puzzle["nums"], puzzle["target"]
            w = _wrong_equation(e, nums, t, evaluate, check_expression)
            try:
                wv = evaluate(w)[0]
            except ValueError:  # CountdownError
                wv = Fraction(t + 1)
            v = str(wv) if wv != t and wv.denominator == 1 else str(t + 1)
            groups = [g for g in re.findall(r"\(([^()]+)\)", e)]
            steps = [f"{g} = {evaluate(g)[0]}" for g in groups] + [f"{e} = {t}"]
            forms = {"e": e, "e_plain": e, "t": t, "e_latex": e.replace("*", "\\times").replace("/", "\\div"),
                     "e_unicode": e.replace("*", "×").replace("/", "÷").replace("-", "−"),
                     "e_x": e.replace(" * ", " x "), "e_nospace": e.replace(" ", "")}
            fields = {**forms, "w": w, "v": v, "k": len(nums), "nums": ", ".join(map(str, nums)),
                      "steps": " and ".join(steps), "steps_lines": "\n".join(steps), "n0": nums[0], "n1": nums[1],
                      "s01": nums[0] + nums[1], "p01": nums[0] * nums[1], "d10": nums[1] - nums[0]}
            fields["form"] = T.COUNTDOWN_FORMS[i % len(T.COUNTDOWN_FORMS)].format(**fields)
            if cls in CORRECT_CLASSES["countdown"] and cls not in ("plain", "format"):
                fields["e"] = T.COUNTDOWN_FORMS[rng.randrange(len(T.COUNTDOWN_FORMS))].format(**fields).strip()
            fields["x"], fields["y"] = (w, e) if i % 2 else (e, w)
            template = templates[i % len(templates)]
            if "{y}" not in template:
                fields["x"] = e
            thinking = T.COUNTDOWN_THINKING[i % len(T.COUNTDOWN_THINKING)].format(**fields)
            reply = thinking + template.format(**fields)
            items.append(Item("countdown", cls, cls in CORRECT_CLASSES["countdown"], reply, str(t),
                              "generate_countdown(300, 45)", {"nums": nums, "target": t}))
    return items


def _wrong_equation(e: str, nums: list[int], t: int, evaluate, check) -> str:
    """The equation with one operator changed (else a number used twice): a near miss that is not the target."""
    swaps = {"+": "-", "-": "+", "*": "+", "/": "*"}
    for position, char in enumerate(e):
        if char in swaps:
            candidate = e[:position] + swaps[char] + e[position + 1:]
            if check(candidate, nums, t) is not None and "division by zero" not in (check(candidate, nums, t) or ""):
                return candidate
    return e.replace(str(nums[-1]), str(nums[0]), 1) if nums[0] != nums[-1] else f"{e} + {nums[0]}"


# ------------------------------------------------------------------------------------------ reasoning-gym
RG_NUMERIC = {"basic_arithmetic": "", "chain_sum": "", "leg_counting": " legs", "gcd": "", "lcm": "", "products": "",
              "letter_counting": " times", "count_bits": " bits", "simple_equations": ""}
RG_WORDS = ("spell_backward", "word_sorting")


def _reasoning_gym(batch: str) -> list[Item]:
    import reasoning_gym

    from gym_llm.envs.reasoning_gym import worked_solution

    entries = {name: list(reasoning_gym.create_dataset(name, size=24, seed=4500)) for name in (*RG_NUMERIC, *RG_WORDS)}
    pool = [(name, k) for name in entries for k in range(len(entries[name]))]
    items = []
    for cls in CORRECT_CLASSES["reasoning_gym"] + WRONG_CLASSES["reasoning_gym"]:
        templates = (H.REASONING_GYM if batch == "heldout" else T.REASONING_GYM)[cls]
        rng = random.Random(f"reasoning_gym:{cls}:{batch}")
        for i in range(PER_CLASS["reasoning_gym"]):
            name, k = rng.choice(pool)
            entry = entries[name][k]
            a, numeric = str(entry["answer"]), name in RG_NUMERIC
            w = _wrong_answer(a, numeric, [str(e["answer"]) for e in entries[name]], i)
            variable = (entry.get("metadata") or {}).get("variable")
            fields = {"a": a, "w": w, "unit": RG_NUMERIC.get(name, ""), "var": f"{variable} = " if variable else ""}
            forms = T.REASONING_GYM_FORMS + (T.REASONING_GYM_NUMERIC_FORMS if numeric else [])
            fields["form"] = forms[i % len(forms)].format(**fields)
            fields["x"], fields["y"] = (w, a) if i % 2 else (a, w)
            template = templates[i % len(templates)]
            if "{y}" not in template:
                fields["x"] = a
            worked = worked_solution(name, entry) or ""
            work = worked.rpartition("<answer>")[0].strip() if "\n" in worked else ""
            lead = work + "\n" if work else ("<think>\nLet me work through this carefully.\n</think>\n", "",
                                              "Let me solve this step by step.\n")[i % 3]
            items.append(Item("reasoning_gym", cls, cls in CORRECT_CLASSES["reasoning_gym"],
                              lead + template.format(**fields), a, f"reasoning_gym:{name}(seed=4500)[{k}]",
                              {"dataset": name, "entry": entry}))
    return items


def _wrong_answer(a: str, numeric: bool, answers: list[str], i: int) -> str:
    if numeric:
        others = [x for x in answers if x != a]
        return others[i % len(others)] if others else str(int(a) + 1)
    if ", " in a:  # a list: two words swapped
        words = a.split(", ")
        return ", ".join([words[1], words[0], *words[2:]]) if len(words) > 1 and words[0] != words[1] else a + ", x"
    j = next((j for j in range(len(a) - 1) if a[j] != a[j + 1]), None)
    return a + "x" if j is None else a[:j] + a[j + 1] + a[j] + a[j + 2:]
