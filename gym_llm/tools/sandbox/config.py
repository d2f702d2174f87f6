"""Limits and layout of the Python sandbox."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["SandboxConfig", "Isolation"]

Isolation = Literal["bwrap", "none"]


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """How each sandboxed REPL is confined. Every limit is per REPL process (one per episode).

    Attributes:
        isolation: ``"bwrap"`` (default): bubblewrap with every namespace unshared (user, pid, net,
            ipc, uts, cgroup, mount), a read-only interpreter, a private tmpfs scratch dir and no
            network. ``"none"``: **unsafe** — the REPL runs as a plain host process that can read and
            write every file the host user can; only the seccomp filter and rlimits remain. For
            trusted code or machines where bubblewrap cannot run.
        timeout_s: wall-clock limit per tool call; past it the REPL is killed and restarted
            (its variables are lost) and the call returns a ``timeout`` result.
        memory_limit_mb: ``RLIMIT_AS``, the REPL's address space. Allocations beyond it raise
            ``MemoryError`` in user code.
        cpu_limit_s: ``RLIMIT_CPU``, CPU seconds for the REPL's whole life (one episode); the kernel
            kills it past the limit (+1 s grace for the hard limit).
        file_size_limit_mb: ``RLIMIT_FSIZE``, the largest file user code can write.
        max_open_files: ``RLIMIT_NOFILE``.
        max_threads: threads the REPL may run at once (its main thread included): a ``pids`` cgroup where the host
            has one (see :mod:`gym_llm.tools.sandbox.cgroups`), and ``RLIMIT_NPROC`` on a root host (each REPL has
            a host uid of its own). Unenforced only on a non-root host without a delegated cgroup
            (``PythonTool.limits`` says which apply).
        scratch_size_mb: size of the tmpfs scratch dir (``/scratch``, also ``/tmp`` and ``$HOME``).
        max_files: inodes of the scratch tmpfs (files + directories): bounds the kernel memory a flood of tiny
            files takes, which its size does not.
        cgroups: ``"auto"`` (default): a memory + pids cgroup per sandbox when the host allows it, else rlimits
            only; ``"required"``: refuse to start without one; ``"off"``: never.
        max_output_chars: stdout+stderr (and the last expression's repr) kept per call; the rest is
            dropped and a visible ``[... N more characters truncated ...]`` marker is added.
        max_error_chars: the traceback kept per call (its tail, where the error is).
        allow_subprocess: let user code start processes (``fork``/``exec``). Off by default: as root
            the kernel ignores ``RLIMIT_NPROC``, so seccomp is the only fork-bomb guard. When on, each
            episode gets a fresh sandbox instead of a fresh process in a reused one.
        site_packages: make the host environment's site-packages importable (read-only), so user code
            can ``import numpy``/``sympy`` when they are installed.
        preload: modules imported once per sandbox before any episode (e.g. ``("numpy", "sympy")``);
            every REPL forked from it starts with them imported, for free.
        extra_ro_paths: more host paths bound read-only at the same place (paths below ``/tmp`` appear
            below ``/run/host`` instead: the sandbox's ``/tmp`` is its scratch dir).
        symlinks: ``(target, link)`` pairs made inside the sandbox (bubblewrap's ``--symlink``), e.g.
            ``(("/scratch/workspace", "/home/agent/workspace"),)`` so code that hard-codes a path reaches the
            episode's scratch dir (each REPL resolves the link in its own mount namespace, to its own scratch).
        max_episodes_per_sandbox: a sandbox is replaced after this many episodes.
        startup_timeout_s: how long starting one sandbox may take on an idle machine; the wait is stretched by the
            load (:func:`gym_llm.core.load.load_scaled`: up to 8x when every core has several runnable tasks).
        fork: how a session's fork gets the REPL's state. ``"auto"`` (default): a copy-on-write fork of the live
            REPL where possible (bubblewrap, no ``allow_subprocess``, x86-64 Linux >= 5.6, a REPL with one thread
            and no mapped scratch files), else re-running its calls in a fresh REPL (the reason is logged);
            ``"copy"``: copy-on-write or a ``ForkError``; ``"replay"``: always re-run the calls.
        family_memory_mb: on a host without a memory cgroup, the most memory a REPL and its live copy-on-write copies
            (its *family*, which shares one sandbox) may take together. Each member is charged what it could take
            alone, ``memory_limit_mb + scratch_size_mb`` (its ``RLIMIT_AS`` and its own scratch tmpfs: without a
            cgroup nothing counts the pages they share), and a fork past the budget is refused: ``fork="auto"`` then
            re-runs the calls in a fresh sandbox (bounded like any episode), ``fork="copy"`` raises ``ForkError``.
            Default (``None``): ``4 * (memory_limit_mb + scratch_size_mb)``, a REPL and three copies. Where a memory
            cgroup exists, the family shares the sandbox's (one REPL's budget) and this is not used.
    """

    isolation: Isolation = "bwrap"
    timeout_s: float = 10.0
    memory_limit_mb: int = 1024
    cpu_limit_s: int = 60
    file_size_limit_mb: int = 16
    max_open_files: int = 256
    max_threads: int = 64
    scratch_size_mb: int = 64
    max_files: int = 4096
    cgroups: Literal["auto", "required", "off"] = "auto"
    max_output_chars: int = 4096
    max_error_chars: int = 2048
    allow_subprocess: bool = False
    site_packages: bool = True
    preload: tuple[str, ...] = ()
    extra_ro_paths: tuple[str, ...] = field(default=())
    symlinks: tuple[tuple[str, str], ...] = field(default=())
    max_episodes_per_sandbox: int = 1000
    startup_timeout_s: float = 30.0
    fork: Literal["auto", "copy", "replay"] = "auto"
    family_memory_mb: int | None = None

    @property
    def family_budget_mb(self) -> int:
        """``family_memory_mb``, or its default: room for a REPL and three copies."""
        per_member = self.memory_limit_mb + self.scratch_size_mb
        return self.family_memory_mb if self.family_memory_mb is not None else 4 * per_member

    def __post_init__(self) -> None:
        if self.isolation not in ("bwrap", "none"):
            raise ValueError(
                f"isolation must be 'bwrap' (sandboxed) or 'none' (unsafe, unsandboxed), got {self.isolation!r}."
            )
        for name in ("timeout_s", "startup_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}.")
        if self.fork not in ("auto", "copy", "replay"):
            raise ValueError(f"fork must be 'auto', 'copy' or 'replay', got {self.fork!r}.")
        if self.cgroups not in ("auto", "required", "off"):
            raise ValueError(f"cgroups must be 'auto', 'required' or 'off', got {self.cgroups!r}.")
        for name in ("memory_limit_mb", "cpu_limit_s", "file_size_limit_mb", "max_open_files", "scratch_size_mb",
                     "max_output_chars", "max_error_chars", "max_episodes_per_sandbox", "max_threads", "max_files"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        if self.memory_limit_mb < 64:
            raise ValueError(f"memory_limit_mb must be >= 64 (the interpreter alone needs ~30 MB), got {self.memory_limit_mb}.")
        if self.family_memory_mb is not None and (isinstance(self.family_memory_mb, bool)
                                                  or not isinstance(self.family_memory_mb, int)
                                                  or self.family_memory_mb < self.memory_limit_mb + self.scratch_size_mb):
            raise ValueError(f"family_memory_mb must be None or an int >= memory_limit_mb + scratch_size_mb "
                             f"({self.memory_limit_mb + self.scratch_size_mb}: one REPL), got {self.family_memory_mb!r}.")
        if self.max_threads < 2:
            raise ValueError(f"max_threads must be >= 2 (the interpreter's main thread counts), got {self.max_threads}.")
        if self.max_files < 16:
            raise ValueError(f"max_files must be >= 16, got {self.max_files}.")
        if self.max_open_files < 16:
            raise ValueError(f"max_open_files must be >= 16 (the interpreter needs a few), got {self.max_open_files}.")
        if isinstance(self.preload, str) or not all(isinstance(m, str) and m for m in self.preload):
            raise TypeError(f"preload must be a tuple of module names, got {self.preload!r}.")
        if isinstance(self.extra_ro_paths, str) or not all(isinstance(p, str) for p in self.extra_ro_paths):
            raise TypeError(f"extra_ro_paths must be a tuple of paths, got {self.extra_ro_paths!r}.")
        if isinstance(self.symlinks, str) or not all(
                isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(p, str) and p for p in pair)
                and pair[1].startswith("/") for pair in self.symlinks):
            raise TypeError(f"symlinks must be a tuple of (target, absolute link path) pairs, got {self.symlinks!r}.")
