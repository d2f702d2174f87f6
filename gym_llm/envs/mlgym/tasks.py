"""Reading MLGym task configs from a user's MLGym checkout, and staging their files for the sandboxes.

An MLGym checkout holds task configs (``configs/tasks/<task>.yaml``), dataset configs (``configs/datasets/*.yaml``)
and each task's files (``data/<task>/...``). A task config names its starter code and evaluation script (paths
relative to the checkout), its datasets (paths relative to ``configs/``), its baseline scores and its submission kind
(``task_entrypoint``). :func:`load_mlgym_task` reads one into an :class:`MLGymTask`; :func:`stage_tasks` copies what
each sandbox may see into two host folders:

* ``public/<key>/``: the starter files the agent's workspace starts with, and ``data/`` without the hidden files —
  bound read-only into the agent's sandbox;
* ``private/<key>/``: pristine starter and evaluation files and the full ``data/`` (labels included) — bound only
  into the grading sandbox, never into the agent's.

Only ``PythonSubmissionTasks`` and ``CSVSubmissionTasks`` are supported (``docs/mlgym.md`` says why).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

__all__ = ["MLGymTask", "DEFAULT_HIDDEN_PATTERNS", "load_mlgym_task", "stage_tasks", "lower_is_better"]

SubmissionKind = Literal["python", "csv"]
SUPPORTED_ENTRYPOINTS = {"PythonSubmissionTasks": "python", "CSVSubmissionTasks": "csv"}
DEFAULT_HIDDEN_PATTERNS = ("*ground_truth*", "*label*", "*answer*", "*solution*", "*.secret")
"""Data files (glob on the path relative to the dataset folder, and on the file name) the agent never sees; the
grading sandbox does. A task config's ``secret_files`` are added to these."""
_LOWER_IS_BETTER = ("time", "loss", "error", "rmse", "mse", "mae", "perplexity", "regret", "decisions", "incorrect")


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of ``metric`` is better, guessed from its name (``Time``, ``loss``, ``rmse``, ...).

    MLGym's configs do not say; pass ``higher_is_better=`` to the env when the guess is wrong.

    >>> lower_is_better("Time"), lower_is_better("Accuracy")
    (True, False)
    """
    name = metric.lower()
    return any(word in name for word in _LOWER_IS_BETTER)


@dataclass(frozen=True, kw_only=True)
class MLGymTask:
    """One MLGym task, read from its config.

    Attributes:
        key: a folder-safe unique name (the config's ``id``).
        name: the task's display name.
        description: what the agent is told (``{dataset_docs}`` filled with the datasets' descriptions).
        kind: ``"python"`` (the agent edits Python files the evaluator imports) or ``"csv"`` (the agent writes
            ``submission.csv``).
        config_path: the task config the task came from.
        starter_files: host paths of the files the workspace starts with (evaluation scripts included, as in MLGym).
        evaluation_script: the evaluation script's file name in the workspace (MLGym runs the first one).
        data_dirs: host folders whose contents become the workspace's ``data/``.
        sample_submission: host path of a sample submission, copied into the workspace, or None.
        submission_files: workspace files taken from the agent's workspace into the grading sandbox.
        baseline: the config's first baseline score dict (empty when the config has none).
        metric: the metric the reward is about (a key of the evaluation's JSON output).
        higher_is_better: the direction of ``metric``.
        hidden_patterns: glob patterns of data files kept out of the agent's sandbox.
        training_timeout_s: the config's ``training_timeout`` (MLGym's limit on one training command), or None.
    """

    key: str
    name: str
    description: str
    kind: SubmissionKind
    config_path: Path
    starter_files: tuple[Path, ...]
    evaluation_script: str
    data_dirs: tuple[Path, ...]
    sample_submission: Path | None
    submission_files: tuple[str, ...]
    baseline: Mapping[str, float]
    metric: str
    higher_is_better: bool
    hidden_patterns: tuple[str, ...]
    training_timeout_s: float | None

    @property
    def baseline_score(self) -> float | None:
        """The baseline's value of :attr:`metric` (matched case-insensitively), or None."""
        for name, value in self.baseline.items():
            if name.lower() == self.metric.lower():
                return float(value)
        return None

    def is_hidden(self, relative: str) -> bool:
        """Whether the data file at ``relative`` (to its dataset folder) is kept from the agent."""
        name = os.path.basename(relative)
        return any(fnmatch.fnmatch(relative.lower(), p.lower()) or fnmatch.fnmatch(name.lower(), p.lower())
                   for p in self.hidden_patterns)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        import yaml
    except ImportError as e:  # pragma: no cover - pyyaml ships with the mlgym extra
        from gym_llm.core.extras import MissingExtraError

        raise MissingExtraError("LLMMLGym-v0 reads MLGym's YAML configs with pyyaml, which is not installed. "
                                "Install it with: pip install 'gym-llm[mlgym]' (or pip install pyyaml)", name="yaml") from e
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path} is not valid YAML ({e}); expected an MLGym config.") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a YAML mapping (an MLGym config), got {type(data).__name__}.")
    return data


def resolve_config(task_config_path: str | os.PathLike, mlgym_root: str | os.PathLike | None) -> tuple[Path, Path]:
    """The task config's path and the checkout's root.

    ``task_config_path`` is a path to ``<checkout>/configs/tasks/<task>.yaml`` (the root is then found from it), or,
    with ``mlgym_root``, a path relative to the root or ``configs/tasks``, or a bare task name (``"blotto"``).
    """
    path = Path(task_config_path)
    if mlgym_root is not None:
        root = Path(mlgym_root)
        if not (root / "configs").is_dir():
            raise FileNotFoundError(f"mlgym_root={str(root)!r} has no configs/ folder; expected the root of an "
                                    "MLGym checkout (it holds configs/tasks and data/).")
        for candidate in (path, root / path, root / "configs" / "tasks" / path,
                          root / "configs" / "tasks" / f"{path}.yaml"):
            if candidate.is_file():
                return candidate.resolve(), root.resolve()
        raise FileNotFoundError(f"No task config {str(task_config_path)!r} in the MLGym checkout {str(root)!r}; "
                                f"expected one of {sorted(p.stem for p in (root / 'configs' / 'tasks').glob('*.yaml'))}.")
    if not path.is_file():
        raise FileNotFoundError(f"MLGym task config {str(path)!r} does not exist; pass the path of a "
                                "configs/tasks/<task>.yaml file in your MLGym checkout (or mlgym_root=... and a name).")
    path = path.resolve()
    if path.parent.name == "tasks" and path.parent.parent.name == "configs":
        return path, path.parent.parent.parent
    raise ValueError(f"Cannot tell the MLGym checkout's root from {str(path)!r}: expected it under "
                     "<checkout>/configs/tasks/; pass mlgym_root='<checkout>' as well.")


def load_mlgym_task(
    task_config_path: str | os.PathLike,
    *,
    mlgym_root: str | os.PathLike | None = None,
    dataset_paths: Mapping[str, str | os.PathLike] | None = None,
    submission_files: Sequence[str] | None = None,
    metric: str | None = None,
    higher_is_better: bool | None = None,
    hidden_files: Sequence[str] = (),
) -> MLGymTask:
    """Read one MLGym task config (and its dataset configs) into an :class:`MLGymTask`.

    Args:
        task_config_path, mlgym_root: see :func:`resolve_config`.
        dataset_paths: dataset config path (as the task config writes it, e.g. ``"datasets/3SAT.yaml"``) -> a local
            folder with that dataset's files: for datasets whose config is missing from the checkout, or whose data
            lives elsewhere. Entries a task does not use are ignored (one mapping serves a list of tasks).
        submission_files: workspace files that make up the submission. Default: ``submission.csv`` for CSV tasks;
            for Python tasks the starter files (evaluation script excluded) that the description names in backticks.
        metric: the metric to reward (default: the first key of the config's baseline scores).
        higher_is_better: the metric's direction (default: guessed by :func:`lower_is_better`).
        hidden_files: more glob patterns of data files the agent must not see (added to
            :data:`DEFAULT_HIDDEN_PATTERNS` and the config's ``secret_files``).

    Raises:
        FileNotFoundError: the config, a starter file or a dataset is missing (the message says which and the fix).
        ValueError: an unsupported ``task_entrypoint`` or a malformed config.
    """
    config_path, root = resolve_config(task_config_path, mlgym_root)
    config = _read_yaml(config_path)
    for field in ("id", "description", "task_entrypoint", "evaluation_paths"):
        if field not in config:
            raise ValueError(f"MLGym task config {config_path} has no {field!r}; MLGym requires id, name, description, "
                             "task_entrypoint and evaluation_paths.")
    entrypoint = config["task_entrypoint"]
    if entrypoint not in SUPPORTED_ENTRYPOINTS:
        raise ValueError(f"Task {config['id']!r} has task_entrypoint {entrypoint!r}; LLMMLGym-v0 supports "
                         f"{sorted(SUPPORTED_ENTRYPOINTS)} (model and LM submissions need GPUs and MLGym's own runner).")
    kind: SubmissionKind = SUPPORTED_ENTRYPOINTS[entrypoint]  # type: ignore[assignment]
    starters = tuple(_existing(root / p, f"starter file {p!r} of task {config['id']!r}") for p in
                     config.get("starter_code") or ())
    evaluation = str(config["evaluation_paths"][0])
    if evaluation not in {p.name for p in starters}:
        raise ValueError(f"Task {config['id']!r}: its evaluation script {evaluation!r} is not among its starter_code "
                         f"({[p.name for p in starters]}); LLMMLGym-v0 runs the evaluation script shipped as starter code.")
    data_dirs, docs = _datasets(config, root, dict(dataset_paths or {}))
    description = str(config["description"]).replace("{dataset_docs}", docs)
    sample = config.get("sample_submission")
    baseline = dict((config.get("baseline_scores") or [{}])[0])
    chosen = metric or (next(iter(baseline)) if baseline else None)
    if chosen is None:
        raise ValueError(f"Task {config['id']!r} has no baseline_scores to take the metric name from; pass metric='...' "
                         "(a key of the JSON its evaluation script prints).")
    if submission_files is None:
        submission_files = _default_submission(kind, starters, evaluation, description)
    timeout = config.get("training_timeout")
    return MLGymTask(
        key=str(config["id"]), name=str(config.get("name", config["id"])), description=description, kind=kind,
        config_path=config_path, starter_files=starters, evaluation_script=evaluation, data_dirs=data_dirs,
        sample_submission=_existing(root / sample, f"sample_submission of {config['id']!r}") if sample else None,
        submission_files=tuple(submission_files), baseline={k: float(v) for k, v in baseline.items()}, metric=chosen,
        higher_is_better=not lower_is_better(chosen) if higher_is_better is None else bool(higher_is_better),
        hidden_patterns=(*DEFAULT_HIDDEN_PATTERNS, *map(str, config.get("secret_files") or ()), *hidden_files),
        training_timeout_s=float(timeout) if timeout else None,
    )


def _existing(path: Path, what: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"The {what} is missing: expected {path}. Is the MLGym checkout complete?")
    return path.resolve()


def _datasets(config: Mapping[str, Any], root: Path, overrides: dict[str, Any]) -> tuple[tuple[Path, ...], str]:
    """The dataset folders of a task and the ``{dataset_docs}`` text."""
    dirs, docs = [], ""
    for entry in config.get("dataset_configs") or ():
        if entry in overrides:
            dirs.append(_existing(Path(overrides[entry]), f"folder given for dataset {entry!r}"))
            continue
        dataset_config = root / "configs" / entry
        if not dataset_config.is_file():
            raise FileNotFoundError(
                f"Task {config['id']!r} needs the dataset config {entry!r}, expected at {dataset_config}, which is "
                f"missing. Add it to the checkout, or pass dataset_paths={{{entry!r}: '/path/to/its/data'}} "
                "(a folder with the dataset's files; it becomes the workspace's data/).")
        dataset = _read_yaml(dataset_config)
        if not dataset.get("is_local", False):
            raise ValueError(f"Dataset {entry!r} of task {config['id']!r} is not local (is_local is false: "
                             f"{dataset.get('data_path')!r} is a Hugging Face id); download it and pass "
                             f"dataset_paths={{{entry!r}: '/path/to/its/data'}}.")
        dirs.append(_existing(root / str(dataset["data_path"]), f"data_path of dataset {entry!r}"))
        docs += f"{str(dataset.get('name', entry)).upper()}:\n{dataset.get('description', '')}\n\n"
    return tuple(dirs), docs


def _default_submission(kind: SubmissionKind, starters: Sequence[Path], evaluation: str, description: str
                        ) -> tuple[str, ...]:
    if kind == "csv":
        return ("submission.csv",)
    named = tuple(p.name for p in starters if p.name != evaluation and f"`{p.name}`" in description)
    if not named:
        raise ValueError(f"Cannot tell which starter file the agent edits: the description names none of "
                         f"{[p.name for p in starters if p.name != evaluation]} in backticks; pass submission_files=[...].")
    return named


def _copy_tree(source: Path, dest: Path, skip: Any = None) -> None:
    for dirpath, _, filenames in os.walk(source):
        for filename in filenames:
            src = Path(dirpath) / filename
            relative = src.relative_to(source).as_posix()
            if skip is not None and skip(relative):
                continue
            target = dest / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)


def stage_tasks(tasks: Sequence[MLGymTask], stage: Path) -> None:
    """Copy each task's files into ``stage/public/<key>`` and ``stage/private/<key>`` (see the module docstring).

    Everything is made world-readable: on a root host the sandboxes' processes run as uids of their own, and only
    the sandbox each folder is bound into can reach it."""
    for task in tasks:
        public, private = stage / "public" / task.key, stage / "private" / task.key
        for folder in (public / "starter", public / "data", private / "workspace", private / "data"):
            folder.mkdir(parents=True, exist_ok=True)
        for path in task.starter_files:
            for dest in (public / "starter" / path.name, private / "workspace" / path.name):
                if path.is_dir():
                    _copy_tree(path, dest)
                else:
                    shutil.copyfile(path, dest)
        if task.sample_submission is not None:
            shutil.copyfile(task.sample_submission, public / "starter" / task.sample_submission.name)
        for data_dir in task.data_dirs:
            _copy_tree(data_dir, public / "data", skip=task.is_hidden)
            _copy_tree(data_dir, private / "data")
    for dirpath, dirnames, filenames in os.walk(stage):
        os.chmod(dirpath, 0o755)
        for filename in filenames:
            os.chmod(os.path.join(dirpath, filename), 0o644)
