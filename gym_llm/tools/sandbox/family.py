"""Copy-on-write forks of a sandboxed REPL, and the family of REPLs that share one sandbox (issue 23).

:func:`fork_repl` copies a live REPL from outside with :func:`~gym_llm.tools.sandbox.cowfork.cow_fork`: the host is
the tracer (it has ptrace rights over the sandbox as root, and as the user that owns bubblewrap's user namespace),
the REPL's seccomp filter answers the set-up's calls with ``SECCOMP_RET_TRACE`` (the REPL can never make them
itself), the zygote writes the copy's id maps (the kernel takes them only from a process in the REPL's user
namespace), and the copy gets, before it runs an instruction of its own, a fresh scratch tmpfs holding a copy of the
parent's files. The copy is as confined as the REPL was (the same seccomp filters, rlimits and uid, no capability)
and in namespaces of its own: user, pid (it sees no other process), mount (its own scratch dir), IPC, network, UTS.

The host talks to a copy directly (:class:`CopyChannel`): per call it hands the copy a fresh request pipe and reply
pipe over the copy's own socket and reads one size-capped reply, as the relay does for a zygote's REPL
(:mod:`~gym_llm.tools.sandbox.server`), so code in the copy can only ever report its own call's result.

:class:`Family`: every copy lives in its parent's pid namespace (the zygote's REPL is that namespace's init), so a
parent must outlive its copies. A member whose session ends (closed, timed out, crashed) is *retired*: killed when it
has no live copies, else kept — idle, or stopped with ``SIGSTOP`` when it was running — until its last copy ends.
The sandbox goes back to its pool when the family's last member ends. Known limit: code in a parent that ends its
own process (``os._exit``, a crash, its CPU limit) ends its copies too (they say so on their next call).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

from gym_llm.core.load import load_scaled
from gym_llm.tools.sandbox import cowfork
from gym_llm.tools.sandbox import server as inside
from gym_llm.tools.sandbox.process import ReplChannel, ReplReply, Sandbox, pidfd_pid, write_all
from gym_llm.tools.sandbox.ptrace import Tracee

__all__ = ["CopyChannel", "Family", "fork_repl", "cow_unsupported"]

logger = logging.getLogger(__name__)

SCRATCH = "/scratch"
_MS_NOSUID, _MS_NODEV = 2, 4


def cow_unsupported(config, channel) -> str | None:
    """Why ``channel``'s REPL cannot be forked copy-on-write (None: it can)."""
    if config.isolation != "bwrap":
        return "isolation='none' has no namespaces to give a copy"
    if config.allow_subprocess:
        return "allow_subprocess=True lets the REPL start processes, which a copy would not bring along"
    reason = cowfork.unsupported_reason()
    if reason:
        return reason
    if getattr(channel, "pidfd", None) is None or getattr(channel, "channel_fd", None) is None:
        return "the REPL has no handle for a fork (no pidfd)"
    return None


def _sandbox_pid(pid: int) -> int:
    """``pid`` as the sandbox's pid namespace (bubblewrap's, one below this process's) numbers it."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                pids = line.split()[1:]
                if len(pids) >= 2:
                    return int(pids[1])
    raise cowfork.CowForkError(f"pid {pid} is not in a sandbox's pid namespace")


def _copy_scratch(sandbox: Sandbox, parent: int, child: int, ids: tuple[int, int]) -> None:
    """The parent's scratch files into the copy's fresh scratch tmpfs. This process opens each scratch dir through
    the process's own root (it may: it is their tracer); the zygote copies (``Sandbox.copy_tree``), as the REPL's ids
    and in the sandbox's memory cgroup, which is charged for the copied files."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    src = os.open(f"/proc/{parent}/root{SCRATCH}", flags)
    try:
        dst = os.open(f"/proc/{child}/root{SCRATCH}", flags)
        try:
            if os.fstat(src).st_dev == os.fstat(dst).st_dev:
                raise cowfork.CowForkError("the copy's scratch dir is still its parent's")
            try:
                sandbox.copy_tree(src, dst, *ids)
            except Exception as e:  # SandboxError: say it as the fork's error
                raise cowfork.CowForkError(f"copying the scratch dir failed: {e}") from e
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _mount_scratch(tracee: Tracee, config, uid: int) -> None:
    """Inject, in the stopped copy: mount a fresh tmpfs over the scratch dir (the one it inherited is its parent's),
    with the REPL's size and inode caps, owned by its uid."""
    page = tracee.call("mmap", 0, 4096, 3, 0x22, 0xFFFFFFFFFFFFFFFF, 0)
    options = f"size={config.scratch_size_mb << 20},nr_inodes={config.max_files},mode=0700,uid={uid},gid={uid}"
    tracee.poke(page, b"tmpfs\0")
    tracee.poke(page + 64, SCRATCH.encode() + b"\0")
    tracee.poke(page + 128, options.encode() + b"\0")
    tracee.call("mount", page, page + 64, page, _MS_NOSUID | _MS_NODEV, page + 128)
    tracee.call("munmap", page, 4096)


class CopyChannel:
    """The host's end of a forked REPL: per call, a fresh request and reply pipe handed over the copy's socket (the
    relay's protocol, :mod:`~gym_llm.tools.sandbox.server`). Same interface as
    :class:`~gym_llm.tools.sandbox.process.ReplChannel`."""

    def __init__(self, sock: socket.socket, pid: int, pidfd: int, channel_fd: int, config,
                 seccomp_filters: int | None):
        self.sock = sock
        self.seccomp_filters = seccomp_filters  # as many as its parent's, checked when it was made
        self.pid = pid  # host pid of the copy
        self.pidfd = pidfd
        self.channel_fd = channel_fd
        self.config = config
        self.reply_limit = 16 * (config.max_output_chars + config.max_error_chars) + 4096

    def execute(self, code: str, timeout_s: float | None = None) -> ReplReply:
        start = time.perf_counter()
        deadline = start + (self.config.timeout_s if timeout_s is None else timeout_s)
        limits = self.config.max_output_chars, self.config.max_error_chars
        payload = json.dumps({"code": code, "max_output_chars": limits[0], "max_error_chars": limits[1]}).encode()
        request_read, request_write = os.pipe()
        read_end, write_end = os.pipe()
        try:
            try:
                self.sock.settimeout(max(0.001, deadline - time.perf_counter()))
                socket.send_fds(self.sock, [b"call"], [request_read, write_end])
            except TimeoutError:
                return ReplReply("timeout", "", 0, "", time.perf_counter() - start)
            except OSError:  # the copy is gone: the code did not run
                return ReplReply("dead", "", 0, "", time.perf_counter() - start, self.exit_status())
            finally:
                os.close(request_read)
                os.close(write_end)
            try:
                os.set_blocking(request_write, False)
                write_all(request_write, len(payload).to_bytes(4, "big") + payload, deadline)
            except TimeoutError:
                return ReplReply("timeout", "", 0, "", time.perf_counter() - start)
            except OSError:
                pass  # it died reading: the reply read below sees it
            finally:
                os.close(request_write)
                request_write = -1
            try:
                os.set_blocking(read_end, False)
                raw = inside.read_frame(read_end, self.reply_limit, deadline)
            except TimeoutError:
                return ReplReply("timeout", "", 0, "", time.perf_counter() - start)
            wait_s = min(load_scaled(inside.SETTLE_S), max(0.0, deadline - time.perf_counter()))
            tampered = raw is not None and not inside.Zygote.closed_after(read_end, wait_s)
            reply = inside.Zygote.checked(raw, *limits) if raw is not None and not tampered else None
            if reply is None:  # it died, or broke the protocol: not trusted with another call
                self.kill()
                status = self.exit_status()
                error = ""  # the exit status says why
                if tampered:
                    error = ("the code wrote to the interpreter's reply channel itself (more than one reply, or the "
                             "channel held open)")
                elif status is None:
                    error = ("the interpreter process ended (how cannot be read here: an unprivileged host sees no "
                             "exit status of a process it did not start)")
                return ReplReply("crashed", "", 0, error, time.perf_counter() - start, status)
            return ReplReply(reply["status"], reply["output"], reply["omitted_chars"], reply["error"],
                             time.perf_counter() - start)
        finally:
            for fd in (read_end, request_write):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass

    def exit_status(self, wait_s: float = 1.0) -> int | None:
        """How the copy ended, read from its zombie's ``/proc/PID/stat`` (its parent REPL does not reap it)."""
        end = time.monotonic() + wait_s
        while True:
            try:
                if self.pidfd is None or pidfd_pid(self.pidfd) != self.pid:
                    return None  # reaped (its pid may name another process now)
                with open(f"/proc/{self.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                return None
            if fields[0] in ("Z", "X") and len(fields) >= 50:
                # the kernel shows the exit code only to whom may ptrace the zombie: root here; elsewhere it shows 0
                return int(fields[-1]) if os.geteuid() == 0 else None
            if time.monotonic() > end:
                return None
            time.sleep(0.01)

    def kill(self) -> None:
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Close the channel (the copy's loop then ends) and the pidfd."""
        self.sock.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def fork_repl(sandbox: Sandbox, channel) -> tuple[CopyChannel, float]:
    """A copy-on-write copy of ``channel``'s REPL (a zygote's :class:`ReplChannel` or a :class:`CopyChannel`), idle
    between calls, in ``sandbox``. Returns its channel and how long the fork took (s).

    Raises:
        CowForkError: the REPL cannot be copied (e.g. it runs threads or maps scratch files: :func:`cowfork.hazards`),
            or a step failed; the REPL goes on as before and no copy is left.
    """
    reason = cow_unsupported(sandbox.config, channel)
    if reason:
        raise cowfork.CowForkError(reason)
    started = time.perf_counter()
    filters = channel.seccomp_filters  # counted before the REPL ran user code
    if filters is None:
        raise cowfork.CowForkError("how many seccomp filters confine the REPL was not read when it started")
    try:
        pid = pidfd_pid(channel.pidfd)
        uid, gid = cowfork._ids(pid)
    except (OSError, ValueError) as e:
        raise cowfork.CowForkError(f"cannot find the REPL to fork: {e}") from e
    root_host = os.geteuid() == 0
    inner = (uid, gid) if root_host else (0, 0)  # the ids the REPL sees itself as (bubblewrap maps the user to 0)

    nested = isinstance(channel, CopyChannel)  # a copy of a copy: its user namespace's parent is the copy's

    def write_id_maps(child: int, uid_map: str, gid_map: str) -> None:
        userns = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC) if nested else None
        try:
            sandbox.write_id_maps(_sandbox_pid(child), uid_map, gid_map, userns)
        except Exception as e:  # SandboxError: say it as the fork's error
            raise cowfork.CowForkError(str(e)) from e
        finally:
            if userns is not None:
                os.close(userns)

    def setup(tracee: Tracee) -> None:
        _mount_scratch(tracee, sandbox.config, inner[0])
        _copy_scratch(sandbox, pid, tracee.pid, inner)

    forked = cowfork.cow_fork(pid, channel_fd=channel.channel_fd, channel_type=socket.SOCK_SEQPACKET,
                              inner_ids=inner, map_outer_ids=inner, reparent=False, write_id_maps=write_id_maps,
                              cwd=SCRATCH, writable_paths=(SCRATCH,), seccomp_filters=filters, setup=setup,
                              pidfd=True, reap=True, target_pidfd=channel.pidfd)
    forked.channel.shutdown(socket.SHUT_RD)  # the copy's end refuses every send, as a zygote's REPL's does
    copy = CopyChannel(forked.channel, forked.pid, forked.pidfd, channel.channel_fd, sandbox.config, filters)
    return copy, time.perf_counter() - started


@dataclass(eq=False)
class _Member:
    channel: object
    parent: "_Member | None"
    live: bool = True
    children: list["_Member"] = field(default_factory=list)


class Family:
    """The REPLs forked from one zygote REPL (and their forks) in one sandbox, leased from ``pool`` until the last
    ends. Thread-safe."""

    def __init__(self, sandbox: Sandbox, pool, root: ReplChannel):
        self.sandbox = sandbox
        self.pool = pool
        self.root = _Member(root, None)
        self.lock = threading.Lock()
        self.ended = False
        self.members = 1  # the REPLs of the family now: live ones, and retired ones kept (stopped) for their copies
        config = sandbox.config
        self.member_mb = config.memory_limit_mb + config.scratch_size_mb  # what one member can take at most
        # With a memory cgroup the kernel counts the family's pages together in the sandbox's cgroup; without one,
        # each member is charged what it can take, against the family's budget.
        self.budget_mb = None if sandbox.cgroup is not None else config.family_budget_mb

    def fork(self, member: _Member) -> tuple[_Member, float]:
        """A live copy of ``member`` (raises ``CowForkError``, e.g. past the family's memory budget)."""
        with self.lock:
            if self.ended or not member.live:
                raise cowfork.CowForkError("the REPL to fork has ended")
            if self.budget_mb is not None and (self.members + 1) * self.member_mb > self.budget_mb:
                raise cowfork.CowForkError(
                    f"the family's memory budget is spent: {self.members} REPLs of up to {self.member_mb} MiB each "
                    f"(memory_limit_mb + scratch_size_mb; no memory cgroup on this host counts what they share) "
                    f"leave no room for another in family_memory_mb={self.budget_mb}")
            channel, took = fork_repl(self.sandbox, member.channel)
            child = _Member(channel, member)
            member.children.append(child)
            self.members += 1
            return child, took

    def retire(self, member: _Member) -> None:
        """``member``'s session is done with it (closed, or restarting after a timeout or crash). Killed when no copy
        of it lives, else kept, stopped, until then (code the REPL left running — a call that timed out, or a
        profiling hook that fires while it waits for the next call — must not outlive its session)."""
        with self.lock:
            if not member.live:
                return
            member.live = False
            if member.children:  # kept for its copies: stopped, so its code can do nothing more (e.g. end them)
                self._signal(member, signal.SIGSTOP)
            self._prune(member)

    @staticmethod
    def _signal(member: _Member, sig: int) -> None:
        if member.channel.pidfd is not None:
            try:
                signal.pidfd_send_signal(member.channel.pidfd, sig)
            except ProcessLookupError:
                pass

    def _prune(self, member: _Member | None) -> None:
        while member is not None and not member.live and not member.children:
            if member.parent is None:
                self._end()
                return
            member.channel.kill()
            member.channel.close()
            member.parent.children.remove(member)
            self.members -= 1
            member = member.parent

    def _end(self) -> None:
        if self.ended:
            return
        self.ended = True
        self.sandbox.end_repl(self.root.channel)
        self.pool.release(self.sandbox, reusable=self.sandbox.alive)
