"""The program that runs inside a sandbox: a zygote, and per episode a relay and a REPL that is alone.

:mod:`gym_llm.tools.sandbox.launch` reads this file's source after its parts' (``server_io.py``: constants, frames,
libc; ``server_repl.py``: the REPL and its confinement; ``server_relay.py``: the relay) and runs them as one program,
``python -I -S -B -c <source> <config json>``, inside bubblewrap. Standard library only. The host imports it only
for the relay's reply checks, which it applies itself to the copy-on-write copies of a REPL it talks to directly
(:mod:`gym_llm.tools.sandbox.family`).

Process tree of one sandbox (``isolation="bwrap"``; pids as each process sees them)::

    bwrap init (pid 1) ── zygote (never runs user code; non-dumpable)
                            ├─ relay (one per episode; trusted; holds the host's pipes)
                            │    └─ REPL: pid 1 of its OWN pid namespace, own mount and IPC namespaces,
                            │       a fresh tmpfs scratch dir, no /proc, a dedicated uid, no capabilities,
                            │       rlimits, the REPL seccomp allow-list -- runs the user code
                            │         └─ its copy-on-write copies (made by the host's tracer, served by the host:
                            │            each pid 1 of a pid namespace of its own, see family.py)
                            └─ spare relay + REPL (pre-forked for the next episode)

* **The REPL is alone.** It cannot see the zygote, the relays or bubblewrap's init (they are outside its pid
  namespace), so it cannot signal, ptrace, ``prlimit``, open the ``/proc`` files or fds of, or stop any process
  the host depends on; the kernel also ignores signals a namespace's init sends to itself. Its ``/proc`` is an empty
  read-only tmpfs (a new procfs cannot be mounted under bubblewrap's, and the old one shows the other processes).
* **Nothing survives an episode.** The scratch tmpfs (with ``nr_inodes`` and ``size`` caps), the mount and IPC
  namespaces and the process are new per REPL and die with it; the zygote that forks the next REPL is out of
  reach. Every limit is set in the REPL itself.
* **The reply channel is out of band.** The host's request/reply pipes live only in the relay. The relay hands the
  REPL each request over a private socket together with a *fresh* reply pipe for that call, reads one
  length-prefixed, size-capped reply from it, checks and re-frames it for the host, and closes it: what user code
  writes (to stdout, to any fd, from threads after the call) cannot reach the host's channel, and a call can only
  ever report its own result. When the REPL dies the relay answers for it (``crashed``/``dead``) and then dies the
  same way (its wait status mirrors the REPL's, so the host can say why).

Zygote protocol (host <-> zygote over an ``AF_UNIX`` SOCK_SEQPACKET socket, fd ``config["control_fd"]``):

* ``{"op": "spawn"}`` + two fds (request pipe read end, reply pipe write end): hand them to the spare relay;
  answer ``{"op": "spawned", "pid": relay_pid, "uid": repl_uid, "channel_fd": fd}`` + a pidfd of the REPL (the
  host's handle for a copy-on-write fork; ``channel_fd``: the REPL's end of its relay socket).
* ``{"op": "copy_tree", "uid": uid, "gid": gid}`` + two directory fds: copy a REPL's scratch dir into its copy's
  (:meth:`Zygote.copy_tree`); answer ``{"op": "copied"}`` or ``{"op": "error", "message": ...}``.
* ``{"op": "idmap", "pid": pid, "uid_map": text, "gid_map": text}`` (+ for a copy of a copy, an fd of its parent
  copy's user namespace): write the id maps of ``pid`` (a copy of a REPL, in a new user namespace the REPL made: the
  kernel takes its maps only from a process in the parent namespace, with ``CAP_SETUID`` there); answer
  ``{"op": "idmapped"}`` or ``{"op": "error", "message": ...}``.
* ``{"op": "end"}``: SIGKILL the relay and its REPL, reap them; answer ``{"op": "ended", "status": wait_status,
  "clean": bool}`` (``clean`` false when the unsandboxed mode's scratch dir could not be emptied).

Relay <-> host framing: 4-byte big-endian length + JSON. Requests ``{"code", "max_output_chars",
"max_error_chars"}``; replies ``{"status": "ok"|"error"|"crashed"|"dead", "output", "omitted_chars", "error"}``.
"""

import json
import os
import signal
import socket
import sys

if __name__ != "__main__":  # imported by the host; inside the sandbox the parts are one program (launch.py)
    # SETTLE_S and the frame functions are re-exported for the host (process.py, family.py)
    from gym_llm.tools.sandbox.server_io import (CLONE_NEWUSER, COPY_MAX_DEPTH, COPY_MAX_ENTRIES, EXIT_SETUP_FAILED,
                                                   PR_SET_DUMPABLE, PR_SET_PDEATHSIG, SETTLE_S, WIPE_ENTRY_LIMIT, Libc,
                                                   data_extents, read_exact, read_frame, write_frame)
    from gym_llm.tools.sandbox.server_relay import RelayHalf
    from gym_llm.tools.sandbox.server_repl import ReplHalf


_MISSING_PATHS = "<sys.path>"  # the preload-errors key for import paths the sandbox cannot see


class Zygote(RelayHalf, ReplHalf):
    def __init__(self, config):
        self.config = config
        self.sandboxed = bool(config["sandboxed"])
        self.scratch = config["scratch"]
        self.control = socket.socket(fileno=config["control_fd"])
        self.repl_filter = bytes.fromhex(config["repl_filter"])
        self.uids = config.get("repl_uids") or []
        self.libc = Libc()
        self.relay = None  # pid of the current episode's relay
        self.repl = None  # pid of its REPL (as the zygote sees it)
        self.spare = None  # (relay pid, handoff socket, repl pid, repl uid, channel fd) of the next episode
        self.forks = 0
        self.setup_error = ""

    # ------------------------------------------------------------------------------ zygote
    def prepare(self):
        import resource

        if self.config.get("become_root"):  # root host: --userns2 put us in a namespace whose 0 is unprivileged
            os.setresgid(0, 0, 0)
            os.setgroups([])
            os.setresuid(0, 0, 0)
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        self.libc.prctl(PR_SET_DUMPABLE, 0)  # nothing can read this process's memory or fds
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        sys.path.extend(self.config["paths"])
        errors = {}
        missing = [path for path in self.config["paths"] if not os.path.isdir(path)]
        if missing:  # the host would see its packages vanish: say so now, not as an ImportError in some episode
            errors[_MISSING_PATHS] = ", ".join(missing)
        for name in ["linecache", "traceback", "_ast", "ctypes", "resource", *self.config["preload"]]:
            try:
                __import__(name)
            except BaseException as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
        import gc

        gc.collect()
        gc.freeze()  # forked REPLs then share these objects without copy-on-write faults from the GC
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        return errors

    def wipe(self):
        """Unsandboxed mode: empty the shared scratch dir; False when it holds too many entries."""
        if self.sandboxed:
            return True  # every REPL mounts its own tmpfs
        count = 0
        for root, dirs, files in os.walk(self.scratch, topdown=False):
            for name in files:
                count += 1
                if count > WIPE_ENTRY_LIMIT:
                    return False
                try:
                    os.unlink(os.path.join(root, name))
                except OSError:
                    pass
            for name in dirs:
                path = os.path.join(root, name)
                count += 1
                try:
                    os.chmod(path, 0o700)
                    os.rmdir(path) if not os.path.islink(path) else os.unlink(path)
                except OSError:
                    pass
        os.chmod(self.scratch, 0o755)
        return not os.listdir(self.scratch)

    def kill_episode(self, relay, repl):
        """SIGKILL a relay and its REPL; reap the relay; return its wait status."""
        for pid in (repl, relay):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        _, status = os.waitpid(relay, 0)
        return status

    def end_child(self):
        if self.relay is None:
            return None
        status = self.kill_episode(self.relay, self.repl)
        self.relay = self.repl = None
        return status

    def fork_spare(self):
        """Fork the next episode's relay, which starts its REPL: the REPL confines itself and warms up, then both
        wait for the host's pipes, so starting an episode costs one message."""
        uid = self.uids[self.forks % len(self.uids)] if self.uids else None
        self.forks += 1
        zygote_end, relay_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            code = EXIT_SETUP_FAILED
            try:
                zygote_end.close()
                self.relay_main(relay_end, uid)
                code = 0
            finally:
                os._exit(code)
        relay_end.close()
        zygote_end.settimeout(30)
        message = None
        try:
            message = json.loads(zygote_end.recv(8192) or b"null")
            repl, channel_fd = int(message["repl"]), int(message["channel_fd"])
        except (OSError, ValueError, TypeError, KeyError):
            self.setup_error = (message.get("failed") if isinstance(message, dict) else None) or "the REPL died"
            zygote_end.close()
            self.kill_episode(pid, None)
            self.spare = None
            return
        zygote_end.settimeout(None)
        self.spare = (pid, zygote_end, repl, uid, channel_fd)

    def take_spare(self):
        if self.spare is not None and os.waitpid(self.spare[0], os.WNOHANG) == (0, 0):
            return self.spare
        if self.spare is not None:  # the spare died (it never ran user code: rare)
            self.spare[1].close()
        self.fork_spare()
        return self.spare

    def spawn(self, fds):
        self.end_child()
        clean = self.wipe()
        spare = self.take_spare()
        self.spare = None
        if spare is None:
            for fd in fds:
                os.close(fd)
            return {"op": "error", "message": f"the REPL could not confine itself: {self.setup_error}"}
        pid, handoff, repl, uid, channel_fd = spare
        try:
            socket.send_fds(handoff, [b"go"], fds)
        finally:
            handoff.close()
            for fd in fds:
                os.close(fd)
        self.relay, self.repl = pid, repl
        return {"op": "spawned", "pid": pid, "uid": uid, "clean": clean, "channel_fd": channel_fd}

    def copy_tree(self, src_root, dst_root, uid, gid):
        """Copy the directory ``src_root`` into ``dst_root`` (fds the host opened: a REPL's scratch dir and its
        copy-on-write copy's fresh one; both are closed here) as ``uid``/``gid`` (the REPL's: files made in the copy's
        tmpfs must be owned by an id its user namespace maps; and the zygote reads no more than the REPL could).
        Files, directories, symlinks (as links: never followed), FIFOs; modes and times kept; at most
        ``COPY_MAX_DEPTH`` levels and ``COPY_MAX_ENTRIES`` entries. Done here, in the sandbox's memory cgroup, which
        is then charged for the copied files."""
        import stat

        setfsuid, setfsgid = self.libc.lib.setfsuid, self.libc.lib.setfsgid
        stack = [(src_root, dst_root, iter(()), None)]  # closed below whatever happens
        try:
            if not isinstance(uid, int) or not isinstance(gid, int):
                raise ValueError(f"uid and gid must be ints, got {uid!r}, {gid!r}")
            setfsgid(gid)
            setfsuid(uid)
            stack[0] = (src_root, dst_root, os.scandir(src_root), None)
            entries = 0
            while stack:
                src, dst, listing, st_dir = stack[-1]
                entry = next(listing, None)
                if entry is None:  # done: the directory's own mode and times last (writing into it changed them)
                    stack.pop()
                    getattr(listing, "close", lambda: None)()
                    if st_dir is not None:
                        os.chmod(dst, stat.S_IMODE(st_dir.st_mode))
                        os.utime(dst, ns=(st_dir.st_atime_ns, st_dir.st_mtime_ns))
                    os.close(src)
                    os.close(dst)
                    continue
                entries += 1
                if entries > COPY_MAX_ENTRIES:
                    raise OSError(f"the scratch dir holds more than {COPY_MAX_ENTRIES} entries")
                name = entry.name
                st = os.stat(name, dir_fd=src, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    if len(stack) > COPY_MAX_DEPTH:
                        raise OSError(f"the scratch dir nests deeper than {COPY_MAX_DEPTH} directories")
                    src_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src)
                    try:
                        os.mkdir(name, 0o700, dir_fd=dst)
                        dst_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dst)
                    except BaseException:
                        os.close(src_fd)
                        raise
                    stack.append((src_fd, dst_fd, os.scandir(src_fd), st))
                elif stat.S_ISREG(st.st_mode):
                    self.copy_file(src, dst, name, st)
                elif stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
                elif stat.S_ISFIFO(st.st_mode):
                    os.mkfifo(name, stat.S_IMODE(st.st_mode), dir_fd=dst)
                else:
                    raise OSError(f"the scratch dir holds {name!r}, neither a file, a directory, a symlink nor a FIFO")
        except (OSError, ValueError, RecursionError) as exc:
            return {"op": "error", "message": f"{type(exc).__name__}: {exc}"}
        finally:
            for src, dst, listing, _ in stack:
                getattr(listing, "close", lambda: None)()
                for fd in {src, dst}:
                    os.close(fd)
            setfsuid(0)
            setfsgid(0)
        return {"op": "copied"}

    @staticmethod
    def copy_file(src, dst, name, st):
        import stat

        src_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=src)
        try:
            if not stat.S_ISREG(os.fstat(src_fd).st_mode):
                raise OSError(f"{name!r} in the scratch dir changed while it was copied")
            dst_fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dst)
            try:
                size = os.fstat(src_fd).st_size
                for start, end in data_extents(src_fd, size):  # holes stay holes: a sparse file costs its data only
                    os.lseek(dst_fd, start, os.SEEK_SET)
                    while start < end:  # (copy_file_range fails across two tmpfs instances on some kernels)
                        sent = os.sendfile(dst_fd, src_fd, start, min(end - start, 1 << 24))
                        if sent <= 0:
                            break
                        start += sent
                os.ftruncate(dst_fd, size)
                os.chmod(dst_fd, stat.S_IMODE(st.st_mode))
                os.utime(dst_fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)

    def write_id_maps(self, pid, uid_map, gid_map, userns=None):
        """Write ``pid``'s id maps. ``userns``: an fd of the user namespace that is the parent of ``pid``'s (a copy of
        a copy; the host opened it: the zygote has no ptrace rights): the kernel takes the maps only from a process in
        there, so a short-lived child of the zygote joins it (``setns`` cannot be undone) and writes them."""
        helper = os.fork() if userns is not None else 0
        if userns is not None and helper:
            os.close(userns)
        if helper:
            _, status = os.waitpid(helper, 0)
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
            if code == 0:
                return {"op": "idmapped"}
            step = "joining" if code >= 128 else "writing the maps from"
            why = os.strerror(code & 127) if code > 0 else f"wait status {status}"
            return {"op": "error", "message": f"{step} the parent copy's user namespace failed: {why}"}
        try:
            if userns is not None:
                try:
                    self.libc.call("setns", userns, CLONE_NEWUSER)
                except OSError as exc:
                    os._exit(128 | min(exc.errno or 1, 127))
            for name, text in (("setgroups", "deny"), ("uid_map", uid_map), ("gid_map", gid_map)):
                with open(f"/proc/{int(pid)}/{name}", "w") as f:
                    f.write(str(text))
        except (OSError, ValueError, TypeError) as exc:
            if userns is not None:
                os._exit(min(getattr(exc, "errno", None) or 1, 127))
            return {"op": "error", "message": f"{type(exc).__name__}: {exc}"}
        if userns is not None:
            os._exit(0)
        return {"op": "idmapped"}

    def serve(self, errors):
        self.control.send(json.dumps({"op": "ready", "pid": os.getpid(), "preload_errors": errors}).encode())
        self.fork_spare()
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.control, 1 << 16, 4)
            except OSError:
                break
            if not data:
                break
            request = json.loads(data)
            op = request.get("op")
            send = []
            if op == "spawn" and len(fds) == 2:
                reply = self.spawn(fds)
                if reply.get("op") == "spawned" and self.sandboxed:
                    try:
                        send = [os.pidfd_open(self.repl)]
                    except OSError:
                        pass  # no pidfds here (kernel < 5.3): the REPL cannot be forked copy-on-write
            elif op == "copy_tree" and len(fds) == 2:
                reply = self.copy_tree(fds[0], fds[1], request.get("uid"), request.get("gid"))
            elif op == "idmap" and len(fds) <= 1:
                reply = self.write_id_maps(request.get("pid"), request.get("uid_map"), request.get("gid_map"),
                                           fds[0] if fds else None)
            elif op == "end":
                for fd in fds:
                    os.close(fd)
                status = self.end_child()
                reply = {"op": "ended", "status": status, "clean": self.wipe()}
            else:
                for fd in fds:
                    os.close(fd)
                reply = {"op": "error", "message": f"unknown request {op!r}"}
            socket.send_fds(self.control, [json.dumps(reply).encode()], send)
            for fd in send:
                os.close(fd)
            if self.spare is None and self.relay is None:
                self.fork_spare()  # after the answer: off the host's critical path
        if self.spare is not None:
            self.kill_episode(self.spare[0], self.spare[2])
        self.end_child()



def main():
    zygote = Zygote(json.loads(sys.argv[1]))
    zygote.serve(zygote.prepare())


if __name__ == "__main__":
    main()
