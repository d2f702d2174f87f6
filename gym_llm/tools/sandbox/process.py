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
import tempfile
import time
from dataclasses import dataclass

from gym_llm.core.load import load_scaled
from gym_llm.tools.sandbox import cgroups, userns
# ReplChannel and ReplReply live in channel.py, how a sandbox is launched in launch.py; both are re-exported here,
# where the rest of gym_llm imports them (with _sandbox_path, write_all, HOST_MOUNTS and check_interpreter)
from gym_llm.tools.sandbox.channel import ReplChannel, ReplReply, write_all  # noqa: F401
from gym_llm.tools.sandbox.config import SandboxConfig
from gym_llm.tools.sandbox.launch import (HOST_MOUNTS, SCRATCH, SandboxError, SandboxUnavailableError,  # noqa: F401
                                          _bwrap_argv, _environment_problem, _import_paths, _interpreter,
                                          _sandbox_env, _sandbox_path, _server_source, check_interpreter, find_bwrap)
from gym_llm.tools.sandbox.seccomp import SELF_PID_PLACEHOLDER, repl_filter, sandbox_filter

__all__ = ["Sandbox", "ReplChannel", "ReplReply", "SandboxError", "SandboxUnavailableError", "find_bwrap"]

logger = logging.getLogger(__name__)

_CONTROL_TIMEOUT_S = 5.0
_CGROUP_SLACK_BYTES = 32 << 20  # the pre-forked spare REPL and the relays, beyond the sandbox's start-up size
_CGROUP_TASKS = 16  # zygote, relays, spare REPL, bwrap: tasks beyond the REPL's max_threads
_JOIN_CGROUP = 'for f do case $f in --) shift; break;; esac; echo $$ > "$f" || exit 96; shift; done; exec "$@"'
_CGROUPS: "cgroups.CgroupSupport | None" = None
_SANDBOX_IDS = itertools.count()


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
