"""The REPL's relay socket: what code can do with the one channel it holds (docs/security.md, "The reply channel").

A REPL holds one Unix socket (SOCK_SEQPACKET): its relay (or, for a copy-on-write copy, the host) sends each call's
fresh request and reply pipes over it. The other end stops reading before any user code runs, so the REPL's end
refuses every send: nothing can be written, no descriptor passed back, nothing flooded. What the REPL can still do
is *receive* on it — take the next call's pipes before its own serving loop does — which lets code choose a later
result of its **own** episode, a power it already has (it shares a process with the REPL's reply code); no other
episode, no copy and no host reads anything from it.

Runs as the user running the suite and again as uid 65534 (``test_sandbox_unprivileged.py``).
"""

from __future__ import annotations

import pytest

from gym_llm.tools import PythonTool
from gym_llm.tools.base import ToolCall

FIND_SOCKET = """
import os, socket, stat
def relay_socket():
    found = []
    for fd in range(0, 1024):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                found.append(fd)
        except OSError:
            pass
    assert len(found) == 1, found
    return socket.socket(fileno=os.dup(found[0]))
"""

ABUSE = FIND_SOCKET + """
import json
sock = relay_socket()
frame = json.dumps({"status": "ok", "output": "FORGED", "omitted_chars": 0, "error": ""}).encode()
r, w = os.pipe()
attempts = {
    "frame": lambda: sock.send(len(frame).to_bytes(4, "big") + frame),
    "call": lambda: socket.send_fds(sock, [b"call"], [r, w]),
    "descriptors": lambda: socket.send_fds(sock, [b"x"], [0, 1, 2, r, w]),
    "garbage": lambda: sock.send(os.urandom(200)),
    "empty": lambda: sock.send(b""),
    "flood": lambda: [sock.send(b"z" * 4096) for _ in range(10_000)],
}
results = {}
for name, attempt in attempts.items():
    try:
        attempt()
        results[name] = "sent"
    except OSError as e:
        results[name] = os.strerror(e.errno)
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def tool():
    tool = PythonTool(min_idle=1, timeout_s=10.0, memory_limit_mb=256)
    tool.attach()
    yield tool
    tool.detach()


def call(session, code: str):
    return session.run(ToolCall("python", {"code": code}))


def _refused_everything(content: str) -> None:
    import json

    results = json.loads(content.strip().splitlines()[-1])
    assert set(results.values()) == {"Broken pipe"}, results  # EPIPE: the peer reads nothing, ever


def test_the_repl_can_send_nothing_on_its_socket(tool):
    """Frames, a forged "call", descriptors (its stdio, fresh pipes), garbage, an empty message and a flood: every
    send fails with EPIPE. The calls that follow return their own results, and the next episode is untouched."""
    session = tool.open_session()
    try:
        result = call(session, ABUSE)
        assert result.status == "ok", result.content
        _refused_everything(result.content)
        for word in ("second", "third"):
            assert call(session, f"print({word!r})").content == f"{word}\n"
    finally:
        session.close()
    fresh = tool.open_session()
    try:
        assert call(fresh, "6 * 7").content.strip() == "42"
    finally:
        fresh.close()


def test_a_copy_can_send_nothing_on_its_socket_either(tool):
    """A copy-on-write copy's socket (its peer is the host itself) refuses every send too; parent and copy go on."""
    parent = tool.open_session()
    try:
        assert call(parent, "x = 7").status == "ok"
        copy = parent.fork()
        try:
            assert copy.forked_by == "copy"
            result = call(copy, ABUSE)
            assert result.status == "ok", result.content
            _refused_everything(result.content)
            assert call(copy, "x * 6").content.strip() == "42"
            assert call(parent, "x * 3").content.strip() == "21"
        finally:
            copy.close()
    finally:
        parent.close()


def test_taking_the_next_calls_pipes_reaches_only_its_own_episode(tool):
    """What a REPL *can* do with its socket: a thread receives the next call's pipes and answers it itself. That
    call then reports what the code chose — within its own episode, where code can already choose its own results
    — while a copy made before, and every other episode, get their own."""
    session = tool.open_session()
    try:
        assert call(session, "y = 5").status == "ok"
        sibling = session.fork()
        try:
            hijack = FIND_SOCKET + """
import json, threading
sock = relay_socket()
def answer_next():
    _, fds, _, _ = socket.recv_fds(sock, 16, 2)
    frame = json.dumps({"status": "ok", "output": "CHOSEN\\n", "omitted_chars": 0, "error": ""}).encode()
    os.write(fds[1], len(frame).to_bytes(4, "big") + frame)
    for fd in fds:
        os.close(fd)
threading.Thread(target=answer_next, daemon=True).start()
print("armed")
"""
            assert call(session, hijack).content == "armed\n"
            # Each call's pipes go to whichever of the thread and the serving loop receives first: the thread
            # answers one call of this episode (whichever it wins), every other call answers for itself.
            seen = [call(session, f"print('c{i}')").content for i in range(4)]
            assert all(got in ("CHOSEN\n", f"c{i}\n") for i, got in enumerate(seen)), seen
            assert seen.count("CHOSEN\n") <= 1, seen
            assert call(sibling, "y * 2").content.strip() == "10"  # the copy's calls are its own
        finally:
            sibling.close()
    finally:
        session.close()
    other = tool.open_session()
    try:
        assert call(other, "print('other')").content == "other\n"
    finally:
        other.close()
