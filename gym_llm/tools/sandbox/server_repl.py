"""Part of the sandbox's program (:mod:`gym_llm.tools.sandbox.server`): the REPL — its output capture, its
persistent namespace and call loop, and :class:`ReplHalf`, the zygote's methods that confine a fresh REPL process
(namespaces, mounts, rlimits, credentials, the seccomp filter) before it serves a single call.

Standard library only; one program with the other parts inside the sandbox (see :mod:`.server_io`).
"""

import json
import os
import signal
import socket
import sys

if __name__ != "__main__":  # imported by the host; inside the sandbox the parts are one program (launch.py)
    from gym_llm.tools.sandbox.server_io import (EXIT_LOOP_FAILED, MAX_REQUEST_BYTES, MS_NODEV, MS_NOEXEC, MS_NOSUID,
                                                   MS_PRIVATE, MS_RDONLY, MS_REC, PR_CAP_AMBIENT,
                                                   PR_CAP_AMBIENT_CLEAR_ALL, PR_CAPBSET_DROP, PR_SET_PDEATHSIG,
                                                   PR_SET_SECUREBITS, SECURE_ALL, read_frame, write_frame)


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



class ReplHalf:
    """The REPL's methods of :class:`~gym_llm.tools.sandbox.server.Zygote` (run in the REPL a relay forks)."""

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

