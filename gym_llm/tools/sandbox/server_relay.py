"""Part of the sandbox's program (:mod:`gym_llm.tools.sandbox.server`): the relay, the trusted half of an
episode, which starts the REPL in new namespaces and passes the host's calls to it over fresh pipes, checking each
reply. The host applies the same reply checks (:meth:`RelayHalf.closed_after`, :meth:`RelayHalf.checked`) to the
copy-on-write copies it talks to directly.

Standard library only; one program with the other parts inside the sandbox (see :mod:`.server_io`).
"""

import json
import os
import signal
import socket

if __name__ != "__main__":  # imported by the host; inside the sandbox the parts are one program (launch.py)
    from gym_llm.tools.sandbox.server_io import (CLONE_NEWIPC, CLONE_NEWNS, CLONE_NEWPID, EXIT_SETUP_FAILED,
                                                   MAX_REQUEST_BYTES, PR_SET_PDEATHSIG, SETTLE_S, read_frame,
                                                   write_frame)


class RelayHalf:
    """The relay's methods of :class:`~gym_llm.tools.sandbox.server.Zygote` (run in the relay the zygote forks)."""

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
