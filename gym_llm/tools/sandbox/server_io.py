"""Part of the sandbox's program (:mod:`gym_llm.tools.sandbox.server`): its constants, the length-prefixed frames
of every channel, a file's data extents, and the libc calls the zygote and REPLs confine themselves with.

Standard library only. The parts run inside the sandbox as ONE program (``server_io``, ``server_repl``,
``server_relay``, then ``server``; see ``gym_llm.tools.sandbox.launch._server_source``), so each part names
the others' symbols directly; the host imports them through the guarded imports, which the program skips.
"""

import os

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

