"""``LLMMLGym-v0``: MLGym's ML research tasks, read from a user's MLGym checkout, without Docker.

The agent edits files and runs code in a per-episode workspace inside the project's sandbox, then submits; the
task's own evaluation script scores the submission in a separate sandbox that holds the labels and the pristine
evaluator (:mod:`gym_llm.envs.mlgym.workspace`). ``docs/mlgym.md`` covers setup and the differences from MLGym.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from gym_llm.core.chat import ChatCommon, ChatConfig, ChatEpisode, Response
from gym_llm.core.env import LLMEnv
from gym_llm.core.episode import EnvParts
from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task
from gym_llm.envs.mlgym.tasks import MLGymTask, load_mlgym_task, stage_tasks
from gym_llm.envs.mlgym.workspace import (Evaluation, SubmissionCode, WorkspaceSession, evaluate, module_name,
                                       sandbox_configs)
from gym_llm.tools.base import function_schema
from gym_llm.tools.parsing import parse_tool_calls
from gym_llm.tools.sandbox.process import SandboxError

__all__ = ["LLMMLGymEnv", "LLMMLGymVectorEnv", "make_mlgym", "build_mlgym", "COMMANDS", "MLGYM_SYSTEM_PROMPT"]

logger = logging.getLogger(__name__)

RewardMode = Literal["metric", "improvement", "pass_fail"]
_SESSION = "gym_llm.mlgym"
_MAX_SUBMISSION_BYTES = 64 << 20

MLGYM_SYSTEM_PROMPT = (
    "You are an ML researcher working in a workspace at /home/agent/workspace (no network). Use the tools by "
    'writing <tool_call>{"name": ..., "arguments": {...}}</tool_call> (several per reply are run in order). Edit '
    "the files, run your code, use `validate` to score your current submission, and `submit` once when done: "
    "submitting ends the episode and is what counts."
)
"""The default system prompt of ``LLMMLGym-v0``."""


def _schema(name: str, description: str, **properties: tuple[str, str]) -> dict[str, Any]:
    props = {k: {"type": t, "description": d} for k, (t, d) in properties.items()}
    required = [k for k, (_, d) in properties.items() if not d.startswith("(optional)")]
    return function_schema(name, description, {"type": "object", "properties": props, "required": required})


COMMANDS: tuple[dict[str, Any], ...] = (
    _schema("open", "Open a file in the editor and show a window of its lines.",
            path=("string", "the file's path (relative to the workspace)"),
            line_number=("integer", "(optional) a line to show")),
    _schema("goto", "Move the editor's window to a line.", line_number=("integer", "the line")),
    _schema("scroll_down", "Show the next window of the open file."),
    _schema("scroll_up", "Show the previous window of the open file."),
    _schema("create", "Create a new file (and open it).", filename=("string", "the new file's path"),
            content=("string", "(optional) its text")),
    _schema("edit", "Replace lines start_line..end_line (inclusive) of the open file with new text; "
                    "end_line = start_line - 1 inserts before start_line.",
            start_line=("integer", "first line replaced (1-based)"), end_line=("integer", "last line replaced"),
            replacement=("string", "the new lines")),
    _schema("run", "Run a bash command in the workspace.", command=("string", "the command")),
    _schema("python", "Run Python code (a fresh process) in the workspace.", code=("string", "the code")),
    _schema("validate", "Score the current submission with the task's evaluation (does not end the episode)."),
    _schema("submit", "Submit the current workspace for the final score; ends the episode."),
)
"""The agent's commands as function schemas (passed to the chat template's ``tools``)."""
_EDITOR = {"open", "goto", "scroll_down", "scroll_up", "create", "edit"}


class MLGymHandler:
    """Runs the agent's commands in its workspace and grades ``validate``/``submit`` (see :class:`LLMMLGymEnv`)."""

    def __init__(self, *, tasks: Sequence[MLGymTask], stage: Path, agent_pool: Any, grading_pool: Any,
                 submission_pool: Any, reward: RewardMode, threshold: float | None, failure_reward: float, command_timeout_s: float,
                 eval_timeout_s: float, episode_timeout_s: float, max_output_chars: int, eval_seed: int | None,
                 validate_seed_offset: int = 1):
        self.tasks, self.stage = tasks, stage
        self.agent_pool, self.grading_pool, self.submission_pool = agent_pool, grading_pool, submission_pool
        self.reward, self.threshold, self.failure_reward = reward, threshold, float(failure_reward)
        self.command_timeout_s, self.eval_timeout_s = command_timeout_s, eval_timeout_s
        self.episode_timeout_s, self.max_output_chars = episode_timeout_s, max_output_chars
        self.eval_seed, self.validate_seed_offset = eval_seed, validate_seed_offset
        self._evaluation_runs: set[tuple[str, int]] = set()  # (task, grading pool) whose control evaluation passed

    # ------------------------------------------------------------------------------ episode
    def start(self, episode: ChatEpisode) -> None:
        task = self.tasks[episode.task.data["mlgym_index"]]
        episode.resources[_SESSION] = {"workspace": WorkspaceSession(self.agent_pool, self.stage / "public" / task.key),
                                       "started": time.monotonic(), "validations": 0}

    def close(self, episode: ChatEpisode) -> None:
        state = episode.resources.pop(_SESSION, None)
        if state is not None:
            state["workspace"].close()

    def respond(self, episode: ChatEpisode, reply: Message) -> Response:
        task = self.tasks[episode.task.data["mlgym_index"]]
        state = episode.resources[_SESSION]
        calls = parse_tool_calls(reply.content)
        results, infos = [], []
        for call in calls:
            if time.monotonic() - state["started"] > self.episode_timeout_s:
                return self._final(task, state, "episode_timeout", results, infos, done=True)
            if call.name == "submit" and call.error is None:
                return self._final(task, state, "submit", results, infos, done=True)
            text, status = self._command(task, state, call)
            results.append(Message("tool", text, name=call.name or None, tool_call_id=call.call_id))
            infos.append({"name": call.name, "status": status})
            if status == "workspace_lost":
                return self._final(task, state, "workspace_lost", results, infos, done=True)
        if not calls:
            results.append(Message("user", "No command found. Call a tool with <tool_call>{\"name\": ..., "
                                           "\"arguments\": {...}}</tool_call>; `submit` ends the episode."))
        if episode.turn + 1 >= episode.config.max_turns:  # the step budget is spent: grade what is there (MLGym too)
            return self._final(task, state, "max_steps", results, infos, done=False)
        return Response(0.0, False, tuple(results), {"num_tool_calls": len(calls), "tool_calls": json.dumps(infos)})

    # ------------------------------------------------------------------------------ commands
    def _command(self, task: MLGymTask, state: dict[str, Any], call: Any) -> tuple[str, str]:
        """One command's tool text and status (``ok``, ``error``, ``invalid``, ``workspace_lost``)."""
        if call.error is not None:
            return f"Error: invalid tool call: {call.error}", "invalid"
        args = dict(call.arguments)
        if call.name == "validate":
            state["validations"] += 1
            evaluation, seed = self._evaluate(task, state, self.validate_seed_offset + state["validations"])
            environment = self._environment_error(task, evaluation, seed)
            if environment:
                return (f"Validation could not run ({environment}). This is a problem of the environment, not of "
                        "your submission."), "error"
            return self._validation_text(task, evaluation), "ok" if not evaluation.error else "error"
        if call.name in ("run", "python"):
            key = "command" if call.name == "run" else "code"
            if not isinstance(args.get(key), str):
                return f"Error: {call.name} takes {{\"{key}\": \"...\"}}, got {sorted(args)}.", "invalid"
            args = {key: args[key], "timeout_s": self.command_timeout_s, "max_chars": self.max_output_chars}
        elif call.name not in _EDITOR:
            return f"Error: unknown command {call.name!r}; available: {[c['function']['name'] for c in COMMANDS]}.", \
                "invalid"
        try:
            reply = state["workspace"].call(call.name, self.command_timeout_s + 20, **args)
        except SandboxError as e:
            return f"Error: the workspace's sandbox stopped ({e}); the episode ends.", "workspace_lost"
        if not reply["ok"]:
            return f"Error: {call.name} failed: {reply['error']}", "error"
        text = reply["result"]
        return text, "error" if text.startswith("Error:") else "ok"

    def _validation_text(self, task: MLGymTask, evaluation: Evaluation) -> str:
        if evaluation.error:
            # the raw output may echo hidden data when the submission is code the evaluator runs: shown only
            # for tasks without hidden files
            detail = "" if self._has_hidden(task) else f"\n{evaluation.output[-self.max_output_chars:]}"
            return f"Validation failed: {evaluation.error}.{detail}"
        return (f"Your submission scored {json.dumps(evaluation.metrics)} (baseline {json.dumps(task.baseline)}). "
                "This does not end the episode; call submit when you are done.")

    def _has_hidden(self, task: MLGymTask) -> bool:
        public = sum(1 for _ in (self.stage / "public" / task.key / "data").rglob("*"))
        return public != sum(1 for _ in (self.stage / "private" / task.key / "data").rglob("*"))

    # ------------------------------------------------------------------------------ grading
    def _evaluate(self, task: MLGymTask, state: dict[str, Any], seed_offset: int) -> tuple[Evaluation, int | None]:
        seed = None if self.eval_seed is None else self.eval_seed + seed_offset
        try:
            files = state["workspace"].read_files(task.submission_files, _MAX_SUBMISSION_BYTES)
        except SandboxError as e:
            return Evaluation({}, "", None, False, f"the submission could not be read: {e}"), seed
        missing = [name for name, data in files.items() if data is None]
        if missing:
            return Evaluation({}, "", None, False, f"no submission: {missing} missing from the workspace (the "
                              f"task's submission is {list(task.submission_files)})"), seed
        argv = evaluation_argv(task, seed)
        code = None if self.submission_pool is None else SubmissionCode(
            self.submission_pool, self.stage / "public" / task.key, self.stage / "channels", seed)
        return evaluate(self.grading_pool, self.stage / "private" / task.key, files, argv, self.eval_timeout_s,
                        self.max_output_chars, code), seed

    def _final(self, task: MLGymTask, state: dict[str, Any], reason: str, results: list, infos: list,
               *, done: bool) -> Response:
        evaluation, seed = self._evaluate(task, state, 0)
        environment = self._environment_error(task, evaluation, seed)
        value = math.nan if environment else metric_value(evaluation.metrics, task.metric)
        info = {"num_tool_calls": len(infos) + (reason == "submit"), "tool_calls": json.dumps(infos),
                "exit_reason": reason, "metric": value, "metric_name": task.metric,
                "metrics": json.dumps(evaluation.metrics), "evaluation_output": evaluation.output,
                "evaluation_error": evaluation.error, "baseline": _or_nan(task.baseline_score),
                "passed": self._passed(task, value), "eval_seed": -1 if seed is None else seed,
                "mlgym_task": task.key}
        if environment:  # not a score: the episode's reward failed (docs/mlgym.md, "When the evaluation cannot run")
            info["reward_error"] = environment
        return Response(self._reward(task, value), done, tuple(results), info)

    def _environment_error(self, task: MLGymTask, evaluation: Evaluation, seed: int | None) -> str | None:
        """Why ``evaluation`` failed because of this host rather than the submission, or None.

        A sandbox that did not start or failed says so itself. An evaluation that ran and printed no metrics is the
        submission's fault only if the task's evaluation runs here at all: that is checked once per task with a
        **control**, the task's own reference submission (its sample submission, or the starter code) evaluated
        the same way. When the control fails too, the evaluation cannot run on this host (a missing package, an
        interpreter the sandbox cannot see), and no submission's score means anything."""
        if not evaluation.error:
            return None
        if evaluation.environment_error:
            return f"the evaluation could not run: {evaluation.error}"
        ran_here = (task.key, id(self.grading_pool))
        if evaluation.timed_out or ran_here in self._evaluation_runs:
            return None
        control_files = self._control_submission(task)
        if control_files is None:  # nothing to compare with: the failure stays the submission's
            return None
        argv = evaluation_argv(task, seed)
        control = evaluate(self.grading_pool, self.stage / "private" / task.key, control_files, argv,
                           self.eval_timeout_s, self.max_output_chars)
        if not control.error:
            self._evaluation_runs.add(ran_here)
            return None
        logger.error("MLGym task %s: its evaluation fails on the task's own reference submission too (%s); scores "
                     "of this task are not given on this host. Output:\n%s", task.key, control.error,
                     control.output[-2000:])
        return (f"the task's evaluation cannot run on this host: on the task's own reference submission it failed "
                f"too ({control.error}): {control.output.strip()[-500:]}")

    def _control_submission(self, task: MLGymTask) -> dict[str, bytes] | None:
        """The task's reference submission (the sample submission of a CSV task, else the starter files the agent
        edits), as the grader would receive it; None when the task has none."""
        starter = self.stage / "public" / task.key / "starter"
        if task.kind == "csv":
            if task.sample_submission is None:
                return None
            return {task.submission_files[0]: (starter / task.sample_submission.name).read_bytes()}
        files = {name: starter / name for name in task.submission_files}
        if not all(path.is_file() for path in files.values()):
            return None
        return {name: path.read_bytes() for name, path in files.items()}

    def _passed(self, task: MLGymTask, value: float) -> bool:
        threshold = self.threshold if self.threshold is not None else task.baseline_score
        if math.isnan(value) or threshold is None:
            return False
        return value >= threshold if task.higher_is_better else value <= threshold

    def _reward(self, task: MLGymTask, value: float) -> float:
        if math.isnan(value):
            return self.failure_reward
        sign = 1.0 if task.higher_is_better else -1.0
        if self.reward == "metric":
            return sign * value
        if self.reward == "improvement":
            return sign * (value - task.baseline_score)
        return float(self._passed(task, value))


def evaluation_argv(task: MLGymTask, seed: int | None) -> list[str]:
    """How the grader runs the task's evaluation script, in the workspace: ``python <script>`` (CSV tasks also get
    ``--submission_file``, as MLGym passes it); with a seed, Python's ``random`` is seeded first (MLGym does not seed,
    so its game scores vary from run to run)."""
    extra = ["--submission_file", "/home/agent/workspace/submission.csv"] if task.kind == "csv" else []
    if seed is None:
        return ["python", task.evaluation_script, *extra]
    runner = (f"import random, runpy, sys; random.seed({int(seed)}); sys.argv = {[task.evaluation_script, *extra]!r}; "
              f"runpy.run_path({task.evaluation_script!r}, run_name='__main__')")
    return ["python", "-c", runner]


def metric_value(metrics: Mapping[str, Any], name: str) -> float:
    """``metrics[name]`` matched case-insensitively (MLGym's configs and scripts disagree on case), else NaN."""
    for key, value in metrics.items():
        if key.lower() == name.lower() and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return math.nan


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def build_mlgym(
    *,
    task_config_path: str | Sequence[str] | None = None,
    mlgym_root: str | None = None,
    dataset_paths: Mapping[str, str] | None = None,
    submission_files: Mapping[str, Sequence[str]] | None = None,
    metric: Mapping[str, str] | None = None,
    higher_is_better: Mapping[str, bool] | None = None,
    hidden_files: Sequence[str] = (),
    reward: RewardMode = "pass_fail",
    threshold: float | None = None,
    failure_reward: float = 0.0,
    max_turns: int = 50,
    command_timeout_s: float = 120.0,
    eval_timeout_s: float = 600.0,
    episode_timeout_s: float = 3600.0,
    memory_limit_mb: int = 2048,
    workspace_mb: int = 512,
    max_output_chars: int = 10_000,
    eval_seed: int | None = 0,
    system_prompt: str | None = MLGYM_SYSTEM_PROMPT,
    task_order: Literal["shuffle", "sequential"] = "sequential",
    **chat_kwargs: Any,
) -> EnvParts:
    """The parts of ``LLMMLGym-v0`` (arguments: see :class:`LLMMLGymEnv`)."""
    from gym_llm.core.extras import require

    require("tools", "pyseccomp", needed_by="LLMMLGym-v0 (its sandboxes' seccomp filters)")
    if task_config_path is None:
        raise TypeError("LLMMLGym-v0 needs task_config_path: the path of an MLGym task config "
                        "(<checkout>/configs/tasks/<task>.yaml), or a list of them; see docs/mlgym.md.")
    if reward not in ("metric", "improvement", "pass_fail"):
        raise ValueError(f"reward must be 'metric', 'improvement' or 'pass_fail', got {reward!r}.")
    for name, value in (("command_timeout_s", command_timeout_s), ("eval_timeout_s", eval_timeout_s),
                        ("episode_timeout_s", episode_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}.")
    paths = [task_config_path] if isinstance(task_config_path, (str, Path)) else list(task_config_path)
    tasks = [load_mlgym_task(p, mlgym_root=mlgym_root, dataset_paths=dataset_paths,
                             submission_files=(submission_files or {}).get(Path(p).stem),
                             metric=(metric or {}).get(Path(p).stem),
                             higher_is_better=(higher_is_better or {}).get(Path(p).stem), hidden_files=hidden_files)
             for p in paths]
    if len({t.key for t in tasks}) != len(tasks):
        raise ValueError(f"The same MLGym task is listed twice in {paths}.")
    if reward != "pass_fail" or threshold is None:
        for task in tasks:
            if task.baseline_score is None and (reward != "metric" or threshold is None):
                raise ValueError(f"Task {task.key!r} has no baseline for metric {task.metric!r}, which reward="
                                 f"{reward!r} needs; pass threshold=... with reward='pass_fail', or reward='metric'.")
    return _assemble(tasks, reward=reward, threshold=threshold, failure_reward=failure_reward, max_turns=max_turns,
                     command_timeout_s=command_timeout_s, eval_timeout_s=eval_timeout_s,
                     episode_timeout_s=episode_timeout_s, memory_limit_mb=memory_limit_mb, workspace_mb=workspace_mb,
                     max_output_chars=max_output_chars, eval_seed=eval_seed, system_prompt=system_prompt,
                     task_order=task_order, chat_kwargs=chat_kwargs)


def _remove_stage(stage: Path) -> None:
    channels = stage / "channels"
    if channels.is_dir():
        channels.chmod(0o700)  # listable again, for rmtree
    shutil.rmtree(stage, ignore_errors=True)


def _assemble(tasks: list[MLGymTask], *, command_timeout_s: float, eval_timeout_s: float, memory_limit_mb: int,
              workspace_mb: int, max_turns: int, system_prompt: str | None, task_order: Any,
              chat_kwargs: dict[str, Any], **handler_kwargs: Any) -> EnvParts:
    from gym_llm.tools.sandbox.pool import SandboxPool
    from gym_llm.tools.sandbox.process import find_bwrap

    stage = Path(tempfile.mkdtemp(prefix="gym_llm_mlgym_"))
    stage.chmod(0o755)
    pools: list[Any] = []

    def close() -> None:
        for pool in pools:
            pool.close()
        pools.clear()
        _remove_stage(stage)

    atexit.register(_remove_stage, stage)
    try:
        stage_tasks(tasks, stage)
        # each grading's FIFOs: bound into the grader's and the submission's sandboxes, which may open them by
        # name but not list them (wx for the owner, x for the rest; the bind is read-only)
        (stage / "channels").mkdir(mode=0o700)
        (stage / "channels").chmod(0o311)
        agent, grader, submission = sandbox_configs(
            stage=stage, memory_limit_mb=memory_limit_mb, command_timeout_s=command_timeout_s,
            eval_timeout_s=eval_timeout_s, workspace_mb=workspace_mb, max_files=16_384, max_threads=64)
        bwrap = find_bwrap()
        pools += [SandboxPool(agent, min_idle=1, bwrap=bwrap), SandboxPool(grader, min_idle=1, bwrap=bwrap)]
        if any(module_name(name) for task in tasks for name in task.submission_files):
            pools.append(SandboxPool(submission, min_idle=1, bwrap=bwrap))
        handler = MLGymHandler(tasks=tasks, stage=stage, agent_pool=pools[0], grading_pool=pools[1],
                               submission_pool=pools[2] if len(pools) > 2 else None,
                               command_timeout_s=command_timeout_s, eval_timeout_s=eval_timeout_s, **handler_kwargs)
        task_list = [Task(i, (Message("user", f"# {t.name}\n\n{t.description}"),), data={"mlgym_index": i,
                                                                                          "mlgym_task": t.key})
                     for i, t in enumerate(tasks)]
        common = ChatCommon(ChatConfig(max_turns=max_turns, system_prompt=system_prompt, **chat_kwargs), handler,
                            tools=list(COMMANDS))
    except BaseException:
        close()
        raise
    return EnvParts(tasks=task_list, new_episode=common.new_episode, observation_space=common.observation_space,
                    action_space=common.action_space, task_order=task_order, parallel_respond=True, on_close=close,
                    extra={"chat": common, "mlgym_tasks": tuple(tasks)}, respond_workers="per_env")


class LLMMLGymEnv(LLMEnv, build=build_mlgym):
    """MLGym tasks (ML research: edit code, run it, submit) from a user's MLGym checkout, sandboxed, without Docker.

    ## Description
    Each episode is one MLGym task. The agent gets the task's description and a workspace
    (``/home/agent/workspace``, its own per episode) holding the task's starter code and a read-only ``data/``
    (hidden files such as ``ground_truth.csv`` left out). Each reply may call commands with
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``: ``open``, ``goto``, ``scroll_down``/``scroll_up``,
    ``create``, ``edit`` (replace a line range), ``run`` (bash), ``python``, ``validate`` (score now, keep going) and
    ``submit`` (final score, episode ends). Commands run in the project's sandbox (bubblewrap + seccomp + rlimits /
    cgroups, no network, see ``docs/security.md``). Grading copies only the submission files (``submission.csv``, or
    the Python file the task has the agent edit) into a *separate* sandbox holding the pristine evaluation script and
    the full data, and runs the task's own evaluation script there.

    ## Action Space
    Text mode: ``UnicodeText(max_action_chars)``; tokens mode: padded ids + mask (see ``LLMChat-v0``).

    ## Observation Space
    The conversation rendered with the chat template (the commands' schemas in its ``tools``), or its token ids:
    command outputs are appended as ``tool`` turns, new tokens only.

    ## Rewards
    | step | reward |
    |---|---|
    | commands, validate | 0.0 |
    | submit (or the budget's end) | ``reward="pass_fail"`` (default): 1.0 if the metric reaches ``threshold`` (default: the task's baseline), else 0.0; ``"metric"``: the metric (negated when lower is better); ``"improvement"``: metric minus baseline (sign-adjusted); ``failure_reward`` (0.0) when the evaluation fails |

    ## Starting State
    The next task of the config list; a fresh workspace (started on the first command).

    ## Episode End
    Terminated by ``submit``, by the episode's wall clock (``episode_timeout_s``) or when the workspace's sandbox
    dies (``info["exit_reason"]``: ``submit``/``episode_timeout``/``workspace_lost``); truncated at ``max_turns``
    (the step budget), where the workspace is graded as if submitted (``exit_reason="max_steps"``), as MLGym does.
    ``info`` on the final step: ``metric``, ``metric_name``, ``metrics`` (JSON), ``evaluation_output``,
    ``evaluation_error``, ``baseline``, ``passed``, ``eval_seed``, ``mlgym_task``.

    ## Arguments
    * ``task_config_path``: a task config in an MLGym checkout (``<checkout>/configs/tasks/<task>.yaml``) or a list;
      ``mlgym_root``; ``dataset_paths`` (``{"datasets/x.yaml": folder}``: datasets missing from the checkout);
      per-task (keyed by config file stem) ``submission_files``, ``metric``, ``higher_is_better``; ``hidden_files``;
    * ``reward``, ``threshold``, ``failure_reward``; ``eval_seed`` (seeds ``random`` for the evaluation; None: unseeded,
      like MLGym; validate uses ``eval_seed + k`` for its k-th call, submit ``eval_seed``);
    * budgets: ``max_turns`` (50), ``command_timeout_s`` (120), ``eval_timeout_s`` (600), ``episode_timeout_s``
      (3600), ``memory_limit_mb`` (2048), ``workspace_mb`` (512), ``max_output_chars`` (10,000 per command);
    * every ``ChatConfig`` field (``mode``, ``tokenizer``, ``system_prompt``, ...).

    ## Vectorized environment
    :class:`LLMMLGymVectorEnv` runs the sub-envs' commands in parallel threads; with several configs and
    ``task_assignment="partition"`` sub-envs work on different tasks at once.

    ## Version History
    * v0: initial version.
    """


LLMMLGymVectorEnv = LLMMLGymEnv.Vector


def make_mlgym(task_config_path: str | Sequence[str], **kwargs: Any) -> LLMMLGymEnv:
    """``gym.make("LLMMLGym-v0", task_config_path=..., **kwargs)``: an env over one MLGym task config (or a list).

    Example::

        env = make_mlgym("~/MLGym/configs/tasks/battleOfSexes.yaml", max_turns=20)
    """
    import gymnasium as gym

    import gym_llm  # noqa: F401  (registers the ids)

    if isinstance(task_config_path, str):
        task_config_path = str(Path(task_config_path).expanduser())
    return gym.make("LLMMLGym-v0", task_config_path=task_config_path, **kwargs)
