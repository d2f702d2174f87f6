"""The program that runs inside a sandbox: a zygote that forks one fresh REPL process per episode.

Not imported by gym_llm: :mod:`gym_llm.tools.sandbox.process` reads this file's source and runs it as
``python -I -S -B -c <source> <config json>`` inside bubblewrap. Standard library only.

Zygote (one per sandbox, never runs user code). Talks to the host over an ``AF_UNIX`` SOCK_SEQPACKET
socket (fd ``config["control_fd"]``), one JSON message per packet:

* ``{"op": "spawn"}`` with two fds attached (request pipe read end, reply pipe write end): wipe the
  scratch dir, fork a REPL that serves those pipes; answer ``{"op": "spawned", "pid": p}``.
* ``{"op": "end"}``: SIGKILL the REPL if it still runs, reap it, wipe the scratch dir; answer
  ``{"op": "ended", "status": wait_status, "clean": bool}`` (``clean`` is false when the scratch dir
  could not be emptied quickly; the host then retires the sandbox).

REPL (the forked child). Before it reads any user code it closes every fd but its two pipes, sets
``RLIMIT_AS``/``RLIMIT_CPU``, asks for SIGKILL if the zygote dies, and stacks the REPL seccomp filter.
Then per request (4-byte big-endian length + JSON ``{"code", "max_output_chars", "max_error_chars"}``)
it runs the code in one persistent namespace — Jupyter-style, the value of a final expression is
printed — and answers (same framing) ``{"status": "ok"|"error", "output", "omitted_chars", "error"}``.
"""

import json
import os
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
MAX_REQUEST_BYTES = 1 << 24
WIPE_ENTRY_LIMIT = 20_000  # a scratch dir with more entries is not worth wiping: the host retires the sandbox


def read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
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
        except BaseException:  # e.g. MemoryError while formatting
            text = f"{type(exc).__name__}: {exc!s}"[:max_chars]
        return text if len(text) <= max_chars else "[... traceback head truncated ...]\n" + text[-max_chars:]

    def serve(self, request_fd, reply_fd):
        while True:
            header = read_exact(request_fd, 4)
            if header is None:
                return
            size = int.from_bytes(header, "big")
            payload = read_exact(request_fd, size) if size <= MAX_REQUEST_BYTES else None
            if payload is None:
                return
            request = json.loads(payload)
            reply = self.run(request["code"], int(request["max_output_chars"]), int(request["max_error_chars"]))
            write_frame(reply_fd, json.dumps(reply).encode("ascii"))


class Zygote:
    def __init__(self, config):
        import ctypes

        self.config = config
        self.scratch = config["scratch"]
        self.control = socket.socket(fileno=config["control_fd"])
        self.repl_filter = bytes.fromhex(config["repl_filter"])
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.child = None
        self.spare = None  # (pid, handoff socket) of the pre-forked next REPL

    def prepare(self):
        import resource

        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        self.libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # REPLs cannot open this process's /proc/<pid>/mem
        for name, value in (("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", self.config["file_size_bytes"]),
                            ("RLIMIT_NOFILE", self.config["max_open_files"])):
            resource.setrlimit(getattr(resource, name), (value, value))
        sys.path.extend(self.config["paths"])
        errors = {}
        for name in ["linecache", "traceback", "_ast", *self.config["preload"]]:
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
        """Empty the scratch dir; False when it holds too many entries to be worth it."""
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

    def end_child(self):
        if self.child is None:
            return None
        try:
            os.kill(self.child, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(self.child, 0)
        self.child = None
        return status

    def fork_spare(self):
        """Fork the next REPL ahead of time: it sets its limits and filter, warms up, then waits for
        its pipes on a private socket, so starting an episode's REPL costs one message."""
        zygote_end, repl_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                self.child_main(repl_end)
            finally:
                os._exit(0)
        repl_end.close()
        self.spare = (pid, zygote_end)

    def take_spare(self):
        if self.spare is not None:
            pid, handoff = self.spare
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                return pid, handoff
            handoff.close()  # the spare died (it never runs user code, so this is rare)
        self.fork_spare()
        return self.spare

    def spawn(self, fds):
        self.end_child()
        clean = self.wipe()
        pid, handoff = self.take_spare()
        self.spare = None
        try:
            socket.send_fds(handoff, [b"go"], fds)
        finally:
            handoff.close()
            for fd in fds:
                os.close(fd)
        self.child = pid
        return {"op": "spawned", "pid": pid, "clean": clean}

    def child_main(self, handoff):
        import ctypes
        import resource

        self.control.detach()
        keep = sorted({0, 1, 2, handoff.fileno()})
        for low, high in zip(keep, keep[1:] + [1 << 20]):
            os.closerange(low + 1, high)
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        memory = self.config["memory_bytes"]
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = self.config["cpu_s"]
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        os.chdir(self.scratch)
        bpf = bytearray(self.repl_filter)  # put this process's pid where the filter says "self"
        placeholder, pid = self.config["self_pid_placeholder"], os.getpid()
        for offset in range(0, len(bpf), 8):
            if int.from_bytes(bpf[offset + 4:offset + 8], sys.byteorder) == placeholder:
                bpf[offset + 4:offset + 8] = pid.to_bytes(4, sys.byteorder)
        program = ctypes.create_string_buffer(bytes(bpf), len(bpf))

        class Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        fprog = Fprog(len(self.repl_filter) // 8, ctypes.addressof(program))
        if self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or self.libc.prctl(
            PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0
        ) != 0:
            os._exit(97)  # never run user code without the filter
        repl = Repl()
        repl.run("_ = [str(i) for i in range(3)]\nprint(_)\n_", 100, 100)  # touch the hot paths before the episode
        repl.namespace.pop("_", None)
        repl.cells = 0
        _, fds, _, _ = socket.recv_fds(handoff, 16, 2)
        handoff.close()
        if len(fds) == 2:
            repl.serve(*fds)

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
            op = json.loads(data).get("op")
            if op == "spawn" and len(fds) == 2:
                reply = self.spawn(fds)
            elif op == "end":
                for fd in fds:
                    os.close(fd)
                status = self.end_child()
                reply = {"op": "ended", "status": status, "clean": self.wipe()}
            else:
                for fd in fds:
                    os.close(fd)
                reply = {"op": "error", "message": f"unknown request {op!r}"}
            self.control.send(json.dumps(reply).encode())
            if self.spare is None and op in ("spawn", "end") and self.child is None:
                self.fork_spare()  # after the answer: off the host's critical path
        self.end_child()


def main():
    zygote = Zygote(json.loads(sys.argv[1]))
    zygote.serve(zygote.prepare())


if __name__ == "__main__":
    main()
