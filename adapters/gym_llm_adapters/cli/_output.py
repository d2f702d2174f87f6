"""Where the ``gym-llm`` command's output goes.

The terminal shows what the user runs the command for: gym-llm's own progress, evaluations, warnings and summary.
Known noise from the dependencies — vLLM's CPU advice (``LD_PRELOAD``, thread binding), "Triton not installed",
deprecation warnings, TRL's version warning, transformers' weight-loading bars — goes to the run's log file instead
(``gym-llm train``: ``OUT/train.log``; ``gym-llm eval``: beside ``--out``, else a temporary file whose path is
printed). A dependency's *error* still prints. ``-v/--verbose`` leaves every dependency's output on the terminal.

:func:`quiet_dependencies` runs first (some switches are environment variables read when a dependency is imported);
a command calls :func:`log_to` once it knows its log file and before it loads a model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Iterator

__all__ = ["DEPENDENCY_LOGGERS", "quiet_dependencies", "log_to", "log_path"]

logger = logging.getLogger("gym_llm_adapters.cli")

#: The loggers whose records go to the log file (errors also to the terminal). ``py.warnings``: Python warnings
#: raised in a dependency's code.
DEPENDENCY_LOGGERS = ("vllm", "torch", "transformers", "trl", "datasets", "huggingface_hub", "accelerate", "peft",
                      "httpx", "httpcore", "urllib3", "filelock", "py.warnings")

#: Switches read when a dependency is imported (set only where the user has not set them):
#: vLLM's records go through Python logging (not its own handler on stdout), c10's C++ warnings (NUMA binding)
#: are dropped below errors.
_QUIET_ENVIRONMENT = {"VLLM_CONFIGURE_LOGGING": "0", "TORCH_CPP_LOG_LEVEL": "ERROR"}

_OUR_PACKAGES = ("gym_llm", "gym_llm_adapters", "gym_llm_verifiers")


class _DeferredFile(logging.Handler):
    """Holds records until :meth:`open` names the file, then writes them and every later one there."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.pending: list[logging.LogRecord] = []
        self.file: logging.FileHandler | None = None
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is None:
            if len(self.pending) < 10_000:  # a command that never names its file keeps a bounded buffer
                self.pending.append(record)
        else:
            self.file.emit(record)

    def open(self, path: Path, mode: str) -> None:
        if self.file is not None:
            self.file.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = logging.FileHandler(path, mode=mode, encoding="utf-8")
        self.file.setFormatter(self.formatter)
        for record in self.pending:
            self.file.emit(record)
        self.pending.clear()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        super().close()


_FILE: _DeferredFile | None = None
_BARS_DISABLED = [False]  # transformers' bars were on, and are off until quiet_dependencies ends
_SHOW = [warnings.showwarning]
#: logger name -> (handlers, propagate, level) as the library last set them, put back when quiet_dependencies ends
_OWN_SETTINGS: dict[str, tuple[list[logging.Handler], bool, int]] = {}  # how warnings printed before quiet_dependencies
_ERRORS_TO_TERMINAL = logging.StreamHandler(sys.stderr)
_ERRORS_TO_TERMINAL.setLevel(logging.ERROR)
_ERRORS_TO_TERMINAL.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))


def _is_ours(filename: str) -> bool:
    parts = Path(filename).parts
    return any(package in parts for package in _OUR_PACKAGES) or "site-packages" not in parts and \
        "dist-packages" not in parts and not filename.startswith(("<frozen", sys.base_prefix + os.sep + "lib"))


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning raised in gym-llm's code (or the user's) prints as usual; a dependency's goes to the log file."""
    if _is_ours(str(filename)):
        _SHOW[0](message, category, filename, lineno, file, line)
        return
    logging.getLogger("py.warnings").warning("%s:%s: %s: %s", filename, lineno, category.__name__, message)


@contextlib.contextmanager
def quiet_dependencies(verbose: bool) -> Iterator[None]:
    """Within the block, the dependencies' known noise goes to the log file (``verbose``: nothing changes). Enter
    before any dependency is imported; records are held until :func:`log_to` names the file. On exit the loggers,
    ``warnings.showwarning`` and the environment are as they were (``main`` may run inside a test's process)."""
    global _FILE
    if verbose or _FILE is not None:
        yield
        return
    saved_environment = {name: os.environ.get(name) for name in _QUIET_ENVIRONMENT}
    saved_show = _SHOW[0] = warnings.showwarning
    for name, value in _QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    _FILE = _DeferredFile()
    warnings.showwarning = _show_warning
    _route_dependency_loggers()
    try:
        yield
    finally:
        warnings.showwarning = saved_show
        _route_dependency_loggers()  # notes the settings of a library imported since the last call
        for name, (handlers, propagate, level) in _OWN_SETTINGS.items():  # as the library left them
            dependency = logging.getLogger(name)
            dependency.handlers, dependency.propagate = handlers, propagate
            dependency.setLevel(level)
        _OWN_SETTINGS.clear()
        for name, value in saved_environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _FILE.close()
        _FILE = None
        if _BARS_DISABLED[0]:
            from transformers.utils import logging as transformers_logging

            transformers_logging.enable_progress_bar()
            _BARS_DISABLED[0] = False


def _route_dependency_loggers() -> None:
    """Each dependency logger writes to the log file (and its errors to the terminal) and stops propagating to the
    terminal. Done again in :func:`log_to`: torch and transformers install their own terminal handler on import."""
    if _FILE is None:
        return
    for name in DEPENDENCY_LOGGERS:
        dependency = logging.getLogger(name)
        if dependency.handlers != [_FILE, _ERRORS_TO_TERMINAL] or dependency.propagate:  # its own (new) settings
            own = [h for h in dependency.handlers if h is not _FILE and h is not _ERRORS_TO_TERMINAL]
            _OWN_SETTINGS[name] = (own, dependency.propagate, dependency.level)
        dependency.handlers = [_FILE, _ERRORS_TO_TERMINAL]
        dependency.propagate = False
        if name == "vllm" and dependency.level == logging.NOTSET:
            dependency.setLevel(logging.INFO)
    if "transformers" in sys.modules:  # its "Loading weights" and "Writing model shards" bars
        from transformers.utils import logging as transformers_logging

        if transformers_logging.is_progress_bar_enabled():
            transformers_logging.disable_progress_bar()
            _BARS_DISABLED[0] = True


def log_path() -> Path | None:
    """The log file that dependency messages go to (None: verbose, or not named yet)."""
    return Path(_FILE.file.baseFilename) if _FILE is not None and _FILE.file is not None else None


def log_to(path: Path | None, *, append: bool = True, command: str = "") -> Path | None:
    """Write the dependencies' messages (those held so far and the later ones) to ``path`` — None: a temporary
    file — and say once where they go. Returns the file (None when verbose: they stay on the terminal)."""
    if _FILE is None:
        return None
    if path is None:
        import tempfile

        fd, name = tempfile.mkstemp(prefix=f"gym-llm-{command or 'run'}-", suffix=".log")
        os.close(fd)
        path = Path(name)
    rank = os.environ.get("RANK", "0")
    if rank not in ("", "0"):  # a data-parallel rank other than 0 keeps its own file
        path = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
    _FILE.open(path, "a" if append else "w")
    _route_dependency_loggers()
    logger.info("messages from vLLM, torch and transformers go to %s (-v shows them here)", path)
    return path
