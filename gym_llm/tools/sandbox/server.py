"""The program that runs inside a sandbox: a zygote, and per episode a relay and a REPL that is alone.

:mod:`gym_llm.tools.sandbox.process` reads this file's source and runs it as ``python -I -S -B -c <source> <config
json>`` inside bubblewrap. Standard library only. The host imports it only for the relay's reply checks, which it
applies itself to the copy-on-write copies of a REPL it talks to directly (:mod:`gym_llm.tools.sandbox.family`).

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

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SECCOMP_MODE_FILTER = 2
SECURE_ALL = 0xEF  # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE, each with its lock
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x20000000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 1 << 14, 1 << 18
MAX_REQUEST_BYTES = 1 << 24
WIPE_ENTRY_LIMIT = 20_000  # unsandboxed mode: a scratch dir with more entries is not worth wiping
EXIT_SETUP_FAILED = 97  # the REPL could not confine itself: it never runs user code
EXIT_LOOP_FAILED = 98  # the REPL's own loop failed between calls (e.g. no memory left to receive the next one)
COPY_MAX_DEPTH = 64  # a copy-on-write fork's scratch copy: directory levels and entries (more: the fork falls back)
COPY_MAX_ENTRIES = 20_000


SETTLE_S = 2.0
"""On an idle machine, how long the relay waits for a REPL to close its reply pipe after its frame. The host sends
each call's wait, stretched by the machine's load (``"settle_s"``; the relay shares the REPL's empty ``/proc`` and
cannot read the load itself)."""


def read_exact(fd, n, deadline=None):
    """``n`` bytes from ``fd``, or None at end of file. ``deadline`` (``time.perf_counter()``; a non-blocking fd):
    ``TimeoutError`` past it."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            import select
            import time

            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise TimeoutError
            poller = select.poll()  # not select(): it refuses descriptors >= 1024
            poller.register(fd, select.POLLIN)
            if not poller.poll(max(0, int(remaining * 1000 + 0.999))):
                continue
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def write_frame(fd, payload):
    data = len(payload).to_bytes(4, "big") + payload
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_frame(fd, limit, deadline=None):
    """One length-prefixed frame, or None (EOF or a frame over ``limit`` bytes); ``deadline``: see :func:`read_exact`."""
    header = read_exact(fd, 4, deadline)
    if header is None:
        return None
    size = int.from_bytes(header, "big")
    return read_exact(fd, size, deadline) if size <= limit else None


def data_extents(fd, size):
    """The ``(start, end)`` byte ranges of ``fd`` that hold data, up to ``size`` (``SEEK_DATA``/``SEEK_HOLE``; a
    filesystem without them reports the whole file as data)."""
    import errno

    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole from here
                return
            raise
        if start >= size:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end
        offset = end


class Libc:
    """The few syscalls the standard library does not wrap (or not in every Python version)."""

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)

    def call(self, name, *args):
        result = getattr(self.lib, name)(*args)
        if result != 0:
            errno = self.ctypes.get_errno()
            raise OSError(errno, f"{name}: {os.strerror(errno)}")

    def prctl(self, *args):
        args = (list(args) + [0, 0, 0, 0])[:5]
        self.call("prctl", *[self.ctypes.c_ulong(a) for a in args])

    def mount(self, source, target, fstype, flags, data=None):
        encode = (lambda s: s.encode() if isinstance(s, str) else s)
        self.call("mount", encode(source), encode(target), encode(fstype), self.ctypes.c_ulong(flags),
                  encode(data))

    def drop_capabilities(self):
        """Empty the permitted, effective and inheritable sets (dropping is always allowed)."""
        ctypes = self.ctypes

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable} sets (version 3)
        self.call("capset", ctypes.byref(Header(0x20080522, 0)), data)

    def install_filter(self, program):
        ctypes = self.ctypes
        buffer = ctypes.create_string_buffer(bytes(program), len(program))

        class Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        self.prctl(PR_SET_NO_NEW_PRIVS, 1)
        self.call("prctl", ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                  ctypes.byref(Fprog(len(program) // 8, ctypes.addressof(buffer))), ctypes.c_ulong(0),
                  ctypes.c_ulong(0))


class Capture:
    """A text stream that keeps the first ``limit`` characters and counts the rest."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, limit):
        self.limit, self.parts, self.kept, self.total = limit, [], 0, 0

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.total += len(text)
        room = self.limit - self.kept
        if room > 0:
            part = text[:room]
            self.parts.append(part)
            self.kept += len(part)
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        pass

    def isatty(self):
        return False

    def writable(self):
        return True

    def fileno(self):
        raise OSError("the sandbox's output is captured in memory and has no file descriptor")


class Repl:
    """One persistent namespace; runs cells and formats their output and errors."""

    def __init__(self):
        import builtins

        self.namespace = {"__name__": "__main__", "__builtins__": builtins}
        self.cells = 0

    def run(self, code, max_output_chars, max_error_chars):
        import _ast
        import linecache

        self.cells += 1
        filename = f"<cell {self.cells}>"
        capture = Capture(max_output_chars)
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = capture
        status, error = "ok", ""
        try:
            linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
            tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], _ast.Expr) else None
            exec(compile(tree, filename, "exec", dont_inherit=True), self.namespace)
            if last is not None:
                value = eval(compile(_ast.Expression(last.value), filename, "eval", dont_inherit=True), self.namespace)
                if value is not None:
                    capture.write(repr(value) + "\n")
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the REPL keeps serving
            status, error = "error", self.format_error(exc, max_error_chars)
        finally:
            sys.stdout, sys.stderr = saved
        output = "".join(capture.parts)
        return {"status": status, "output": output, "omitted_chars": capture.total - capture.kept, "error": error}

    @staticmethod
    def format_error(exc, max_chars):
        try:
            import traceback

            tb = exc.__traceback__
            while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
                tb = tb.tb_next  # drop the REPL's own frames
            text = "".join(traceback.format_exception(type(exc), exc, tb))
        except BaseException:  # e.g. MemoryError or RecursionError while formatting
            try:
                text = f"{type(exc).__name__}: {exc!s}"[:max_chars]
            except BaseException:
                text = type(exc).__name__
        return text if len(text) <= max_chars else "[... traceback head truncated ...]\n" + text[-max_chars:]

    def serve(self, sock):
        """Each call arrives on ``sock`` as two fds: the call's own request pipe (read end) and reply pipe (write
        end). Read the request, answer on the reply pipe, close both."""
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(sock, 16, 2)
            except OSError:
                return
            if data != b"call" or len(fds) != 2:
                return
            try:
                payload = read_frame(fds[0], MAX_REQUEST_BYTES)
                if payload is None:
                    continue
                request = json.loads(payload)
                reply = self.run(request["code"], int(request["max_output_chars"]), int(request["max_error_chars"]))
                try:
                    payload = json.dumps(reply).encode("ascii")
                except BaseException:  # e.g. a RecursionError deep in user code's state
                    payload = json.dumps({"status": "error", "output": "", "omitted_chars": 0,
                                          "error": "the REPL could not encode its reply"}).encode("ascii")
                write_frame(fds[1], payload)
            except OSError:
                pass  # the relay stopped reading this call: it has given up on it
            finally:
                for fd in fds:
                    os.close(fd)


_MISSING_PATHS = "<sys.path>"  # the preload-errors key for import paths the sandbox cannot see


class Zygote:
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

    # ------------------------------------------------------------------------------- relay
    def relay_main(self, handoff, uid):
        """The trusted half of an episode: starts the REPL in new namespaces, then relays the host's calls."""
        self.control.detach()
        keep = sorted({0, 1, 2, handoff.fileno()})
        for low, high in zip(keep, keep[1:] + [1 << 20]):
            os.closerange(low + 1, high)
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1 and self.sandboxed:
            return  # the zygote died while we started
        if self.sandboxed:
            self.libc.call("unshare", CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC)
        relay_sock, repl_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        repl = os.fork()
        if repl == 0:
            code = EXIT_SETUP_FAILED
            try:
                handoff.close()
                relay_sock.close()
                self.repl_main(repl_sock, uid)
                code = 0
            finally:
                os._exit(code)
        repl_fd = repl_sock.fileno()  # the REPL's channel: the same fd number in the REPL
        repl_sock.close()
        status = relay_sock.recv(4096)
        if status != b"ready":  # the REPL could not confine itself: it never runs user code
            handoff.send(json.dumps({"failed": status.decode(errors="replace") or "the REPL died"}).encode())
            self.mirror(repl)
        # From here the socket only brings the REPL its calls: shutting down this end's reading makes the REPL's end
        # refuse every send (EPIPE), so user code can write nothing to it, pass no descriptor back and flood nothing
        # (docs/security.md, "The reply channel").
        relay_sock.shutdown(socket.SHUT_RD)
        handoff.send(json.dumps({"repl": repl, "channel_fd": repl_fd}).encode())
        _, fds, _, _ = socket.recv_fds(handoff, 16, 2)
        handoff.close()
        if len(fds) == 2:
            try:
                self.relay_calls(relay_sock, repl, *fds)
            except BaseException as exc:  # a relay bug: say so on the channel rather than vanish
                try:
                    write_frame(fds[1], json.dumps({"status": "crashed", "output": "", "omitted_chars": 0,
                                                    "error": f"relay: {type(exc).__name__}: {exc}"}).encode())
                except OSError:
                    pass
        self.mirror(repl)

    def relay_calls(self, sock, repl, request_fd, reply_fd):
        reply_limit = 16 * (self.config["max_output_chars"] + self.config["max_error_chars"]) + 4096
        while True:
            payload = read_frame(request_fd, MAX_REQUEST_BYTES)
            if payload is None:
                return  # the host closed the episode
            try:
                request = json.loads(payload)
                limits = int(request["max_output_chars"]), int(request["max_error_chars"])
                settle_s = min(max(float(request.get("settle_s", SETTLE_S)), 0.1), 60.0)
            except (ValueError, KeyError, TypeError):
                return
            request_read, request_write = os.pipe()
            read_end, write_end = os.pipe()
            try:
                socket.send_fds(sock, [b"call"], [request_read, write_end])
            except OSError:  # the REPL is gone: the code did not run
                write_frame(reply_fd, json.dumps(self.failure("dead", repl)).encode())
                return
            finally:
                os.close(request_read)
                os.close(write_end)
            try:
                write_frame(request_write, payload)  # the REPL reads it as it arrives (pipes hold 64 KiB)
            except OSError:
                pass  # it died reading: the reply read below sees it
            os.close(request_write)
            raw = read_frame(read_end, reply_limit)
            tampered = raw is not None and not self.closed_after(read_end, settle_s)
            os.close(read_end)
            reply = self.checked(raw, *limits) if raw is not None and not tampered else None
            if reply is None:  # the REPL died, or broke the protocol: it is not trusted with another call
                os.kill(repl, signal.SIGKILL)
                failure = self.failure("crashed", repl)
                if tampered:
                    failure["error"] = ("the code wrote to the interpreter's reply channel itself (more than one reply, "
                                        "or the channel held open)")
                write_frame(reply_fd, json.dumps(failure).encode())
                return
            write_frame(reply_fd, json.dumps(reply).encode())

    @staticmethod
    def closed_after(fd, wait_s=SETTLE_S):
        """Whether the reply pipe ends right after the one frame (the REPL's server writes once, then closes it).
        Extra bytes, or the pipe still held open, mean user code wrote to it too. An honest REPL closes it
        microseconds after writing, but a loaded machine may not run it for a while, so the host stretches
        ``wait_s`` by the load; only code that holds the pipe open ever waits it out."""
        import select

        poller = select.poll()  # not select(): it refuses descriptors >= 1024
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(max(0, int(wait_s * 1000 + 0.999)))) and os.read(fd, 1) == b""

    @staticmethod
    def checked(raw, max_output_chars, max_error_chars):
        """The REPL's reply, re-built from checked fields (None if it is not one)."""
        try:
            reply = json.loads(raw)
            status, output, error = reply["status"], reply["output"], reply["error"]
            omitted = reply["omitted_chars"]
        except BaseException:  # malformed, or nested deep enough for RecursionError
            return None
        if status not in ("ok", "error") or not isinstance(output, str) or not isinstance(error, str):
            return None
        omitted = omitted if isinstance(omitted, int) and omitted >= 0 else 0
        omitted += max(0, len(output) - max_output_chars)
        if len(error) > max_error_chars:
            error = "[... traceback head truncated ...]\n" + error[-max_error_chars:]
        return {"status": status, "output": output[:max_output_chars], "omitted_chars": omitted, "error": error}

    def failure(self, status, repl):
        try:
            _, wait_status = os.waitpid(repl, 0)
        except ChildProcessError:
            wait_status = None
        self.repl_status = wait_status
        return {"status": status, "output": "", "omitted_chars": 0, "error": "", "wait_status": wait_status}

    def mirror(self, repl):
        """Exit the way the REPL did (so the zygote's wait status for this relay says why the REPL ended)."""
        status = getattr(self, "repl_status", None)
        if status is None:
            try:
                os.kill(repl, signal.SIGKILL)
                _, status = os.waitpid(repl, 0)
            except (ChildProcessError, ProcessLookupError):
                status = 0
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) != signal.SIGKILL:
            sig = os.WTERMSIG(status)
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 137)

    # -------------------------------------------------------------------------------- REPL
    def repl_main(self, sock, uid):
        """Confine this process (the REPL), then serve calls from the relay. Never runs user code unconfined."""
        try:
            repl = self.confine(uid, sock.fileno())
        except BaseException as exc:  # say why, then exit: this REPL never runs user code
            sock.send(f"failed: {type(exc).__name__}: {exc}".encode()[:4000])
            raise
        sock.send(b"ready")
        try:
            repl.serve(sock)
        except BaseException:
            os._exit(EXIT_LOOP_FAILED)

    def confine(self, uid, keep_fd):
        """Namespaces, mounts, limits, credentials and the seccomp filter of this REPL; returns its warm Repl."""
        import resource

        config = self.config
        keep = sorted({0, 1, 2, keep_fd})
        for low, high in zip(keep, keep[1:] + [1 << 20]):
            os.closerange(low + 1, high)
        os.setsid()  # a session and process group of its own: kill(0, ...) and F_SETOWN(-pgrp) reach only itself
        try:
            with open("/proc/self/oom_score_adj", "w") as f:  # the first to go when the memory cgroup is full
                f.write("1000")
        except OSError:  # unsandboxed on a non-root host: the non-dumpable zygote's child cannot; no cgroup there
            pass
        if self.sandboxed:
            self.mount_namespace(uid)
        limits = [("RLIMIT_AS", config["memory_bytes"]), ("RLIMIT_CPU", config["cpu_s"]),
                  ("RLIMIT_FSIZE", config["file_size_bytes"]), ("RLIMIT_NOFILE", config["max_open_files"]),
                  ("RLIMIT_CORE", 0), ("RLIMIT_MEMLOCK", 0), ("RLIMIT_MSGQUEUE", 0),
                  ("RLIMIT_SIGPENDING", 64)]  # queued signals are a per-user kernel count: a handful is plenty
        if uid is not None:  # a dedicated uid: the kernel counts this REPL's threads alone
            limits.append(("RLIMIT_NPROC", config["max_threads"]))
        for name, value in limits:
            resource.setrlimit(getattr(resource, name), (value, value + 1 if name == "RLIMIT_CPU" else value))
        if self.sandboxed:
            self.drop_privileges(uid)
        os.chdir(self.scratch)  # as the REPL's own uid: the scratch dir is 0700
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the credential change, which clears it
        program = self.repl_filter
        if not self.sandboxed:  # put this process's pid where the filter says "self" (it is 1 when sandboxed)
            program = bytearray(program)
            placeholder, pid = config["self_pid_placeholder"], os.getpid()
            for offset in range(0, len(program), 8):
                if int.from_bytes(program[offset + 4:offset + 8], sys.byteorder) == placeholder:
                    program[offset + 4:offset + 8] = pid.to_bytes(4, sys.byteorder)
        self.libc.install_filter(program)
        repl = Repl()
        repl.run("_ = [str(i) for i in range(3)]\nprint(_)\n_", 100, 100)  # touch the hot paths before the episode
        repl.namespace.pop("_", None)
        repl.cells = 0
        return repl

    def mount_namespace(self, uid):
        """This REPL's own view: nothing propagates, an empty read-only /proc, a fresh size- and inode-capped
        tmpfs as the scratch dir (owned by the REPL's uid)."""
        config, libc = self.config, self.libc
        libc.mount(None, "/", None, MS_REC | MS_PRIVATE)
        libc.mount("tmpfs", "/proc", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=2")
        if os.path.isdir("/dev/pts"):  # no ptys: /dev/ptmx (-> pts/ptmx) would draw on the host-wide pty pool
            libc.mount("tmpfs", "/dev/pts", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=2")
        owner = f",uid={uid},gid={uid}" if uid is not None else ""
        libc.mount("tmpfs", self.scratch, "tmpfs", MS_NOSUID | MS_NODEV,
                   f"size={config['scratch_bytes']},nr_inodes={config['scratch_inodes']},mode=0700{owner}")

    def drop_privileges(self, uid):
        """No way back to any capability: securebits locked, bounding and ambient sets empty, then (root hosts) a
        dedicated unprivileged uid, and empty capability sets."""
        libc = self.libc
        libc.prctl(PR_SET_SECUREBITS, SECURE_ALL)
        for cap in range(64):
            try:
                libc.prctl(PR_CAPBSET_DROP, cap)
            except OSError:
                break  # past the kernel's last capability
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        libc.drop_capabilities()


def main():
    zygote = Zygote(json.loads(sys.argv[1]))
    zygote.serve(zygote.prepare())


if __name__ == "__main__":
    main()
