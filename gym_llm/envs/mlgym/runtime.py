"""The agent's commands and the grader, as they run *inside* a sandbox (read as text and run in the sandbox's REPL).

Nothing here imports gym_llm: :mod:`gym_llm.envs.mlgym.workspace` sends this file's source to a fresh REPL once per
episode, then each command is one call ``_mlgym(<json request>)`` that prints one JSON reply line. The editor state
(open file, window position) lives in this REPL, which is why each episode has its own. Agent-written code never
runs in the REPL itself: ``run``/``python`` start child processes (their own rlimits, a wall-clock timeout, killed
with every process they started).
"""

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time

WORKSPACE = "/home/agent/workspace"  # a link to the REPL's own scratch dir: MLGym's path, hard-coded by some tasks
_REAL_WORKSPACE = "/scratch/workspace"
_STATE = {"file": None, "first": 1, "window": 100}
_CHILD_PATH = os.pathsep.join(p for p in sys.path if p.endswith("-packages"))
_BIN = "/scratch/.bin"  # `python`/`python3` for commands: the sandbox's interpreter (no python on /usr/bin here)
os.makedirs(_BIN, exist_ok=True)
for _name in ("python", "python3"):
    if not os.path.lexists(os.path.join(_BIN, _name)):
        os.symlink(sys.executable, os.path.join(_BIN, _name))


def _cap(text, limit):
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters of output truncated ...]\n"


def _resolve(path):
    return path if os.path.isabs(path) else os.path.join(WORKSPACE, path)


def _show():
    path, first, window = _STATE["file"], _STATE["first"], _STATE["window"]
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    first = max(1, min(first, max(1, len(lines) - window + 1)))
    _STATE["first"] = first
    last = min(len(lines), first + window - 1)
    out = [f"[File: {path} ({len(lines)} lines total)]"]
    if first > 1:
        out.append(f"({first - 1} more lines above)")
    out += [f"{n}:{lines[n - 1]}" for n in range(first, last + 1)]
    if last < len(lines):
        out.append(f"({len(lines) - last} more lines below)")
    return "\n".join(out)


def _open(path, line_number=None):
    full = _resolve(path)
    if os.path.isdir(full):
        return f"Error: {path} is a directory; open takes a file (use run with `ls {path}` to list it)."
    if not os.path.isfile(full):
        return f"Error: file {path} not found (the workspace is {WORKSPACE}; use create to make a new file)."
    _STATE["file"] = full
    _STATE["first"] = 1 if line_number is None else max(1, int(line_number) - _STATE["window"] // 6)
    return _show()


def _move(delta=None, line_number=None):
    if _STATE["file"] is None:
        return "Error: no file is open; use open first."
    if line_number is not None:
        _STATE["first"] = max(1, int(line_number) - _STATE["window"] // 6)
    else:
        _STATE["first"] += delta
    return _show()


def _create(filename, content=""):
    full = _resolve(filename)
    if os.path.exists(full):
        return f"Error: {filename} already exists; open it, or edit its lines."
    os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(content if content.endswith("\n") or not content else content + "\n")
    return _open(filename)


def _edit(start_line, end_line, replacement):
    if _STATE["file"] is None:
        return "Error: no file is open; open the file to edit first."
    start, end = int(start_line), int(end_line)
    with open(_STATE["file"], encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not (1 <= start <= len(lines) + 1 and start - 1 <= end <= len(lines)):
        return (f"Error: lines {start}-{end} are outside the file ({len(lines)} lines); start_line must be in "
                f"[1, {len(lines) + 1}] and end_line in [start_line - 1, {len(lines)}] (end_line = start_line - 1 "
                "inserts before start_line).")
    new = replacement.split("\n")
    if new and new[-1] == "":
        new.pop()
    lines[start - 1:end] = new
    with open(_STATE["file"], "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + ("\n" if lines else ""))
    _STATE["first"] = max(1, start - _STATE["window"] // 6)
    return "File updated.\n" + _show()


def _run_child(argv, timeout_s, max_chars, stdin=None, env_extra=None, cwd=WORKSPACE, cpu_s=None):
    """Run ``argv``; killed with everything it started past ``timeout_s`` wall-clock seconds or, with ``cpu_s``, past
    that many CPU-seconds (``RLIMIT_CPU``: SIGXCPU, then SIGKILL a second later) — ``timed_out`` either way."""
    env = {"PATH": f"{_BIN}:/usr/bin:/bin", "HOME": WORKSPACE, "LANG": "C.UTF-8", "PYTHONPATH": _CHILD_PATH,
           "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1", **(env_extra or {})}
    start = time.monotonic()
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, preexec_fn=None if cpu_s is None else _cpu_limit(cpu_s))
    try:
        stdout, stderr = child.communicate(stdin.encode() if stdin is not None else b"", timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_all()
        stdout, stderr = child.communicate()
        timed_out = True
    _kill_all()  # nothing a command starts outlives it (background jobs included)
    if cpu_s is not None and child.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not timed_out:
        timed_out = child.returncode == -signal.SIGXCPU or _cpu_spent() >= cpu_s
    return {"returncode": child.returncode, "timed_out": timed_out, "duration_s": time.monotonic() - start,
            "stdout": _cap(stdout.decode("utf-8", "replace"), max_chars),
            "stderr": _cap(stderr.decode("utf-8", "replace"), max_chars)}


def _cpu_limit(cpu_s):
    import math
    import resource

    seconds = max(1, math.ceil(cpu_s))
    return lambda: resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))


def _cpu_spent():
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _kill_all():
    """SIGKILL every other process of this REPL's pid namespace (it is pid 1 there: ``kill(-1)`` spares it). The
    seccomp filter refuses ``setsid``/``setpgid``, so process groups cannot do this."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:  # no other process left
        pass
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break


def _command_text(result, timeout_s):
    text = result["stdout"] + result["stderr"]
    if result["timed_out"]:
        text += f"\n[the command ran longer than {timeout_s:g} s and was killed]"
    elif result["returncode"]:
        text += f"\n[exit code {result['returncode']}]"
    return text or "(no output)"


def _copy_tree(source, dest):
    """Copy files only (no permission bits, times or xattrs: the seccomp filter refuses some of those calls)."""
    for dirpath, _, filenames in os.walk(source):
        target_dir = os.path.join(dest, os.path.relpath(dirpath, source))
        os.makedirs(target_dir, exist_ok=True)
        for filename in filenames:
            shutil.copyfile(os.path.join(dirpath, filename), os.path.join(target_dir, filename))


def _setup(public_dir):
    os.makedirs(_REAL_WORKSPACE, exist_ok=True)
    starter = os.path.join(public_dir, "starter")
    _copy_tree(starter, _REAL_WORKSPACE)
    data = os.path.join(public_dir, "data")
    if os.listdir(data):
        os.symlink(data, os.path.join(_REAL_WORKSPACE, "data"))  # a read-only bind: the data cannot be changed
    os.chdir(WORKSPACE)
    return "ok"


def _read_files(names, max_bytes):
    out = {}
    for name in names:
        full = _resolve(name)
        if os.path.isfile(full) and not os.path.islink(full) and os.path.getsize(full) <= max_bytes:
            with open(full, "rb") as f:
                out[name] = base64.b64encode(f.read()).decode()
        else:
            out[name] = None
    return out


def _grade(private_dir, files, argv, timeout_s, max_chars, cpu_s=None):
    """A fresh workspace from the pristine files, the submission written into it, the evaluation run."""
    _copy_tree(os.path.join(private_dir, "workspace"), _REAL_WORKSPACE)
    data = os.path.join(private_dir, "data")
    if os.listdir(data):
        os.symlink(data, os.path.join(_REAL_WORKSPACE, "data"))
    for name, content in files.items():
        target = os.path.join(_REAL_WORKSPACE, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(base64.b64decode(content))
    argv = [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]
    return _run_child(argv, timeout_s, max_chars, cwd=WORKSPACE, cpu_s=cpu_s)


def _serve_submission(public_dir, files, bridge, call, reply, seed, modules, timeout_s, max_chars):
    """The submission sandbox of a grading: the agent's files over the starter files, then its modules served to
    the grading sandbox's evaluation through the FIFOs ``call``/``reply`` (see bridge.py) until it is done."""
    _setup(public_dir)
    for name, content in files.items():
        target = os.path.join(_REAL_WORKSPACE, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(base64.b64decode(content))
    os.makedirs("/scratch/.bridge", exist_ok=True)
    with open("/scratch/.bridge/_gym_llm_bridge.py", "w", encoding="utf-8") as f:
        f.write(bridge)
    argv = [sys.executable, "/scratch/.bridge/_gym_llm_bridge.py", "serve", call, reply,
            "none" if seed is None else str(int(seed)), *modules]
    return _run_child(argv, timeout_s, max_chars, cwd=WORKSPACE)


def _mlgym(request_json):
    request = json.loads(request_json)
    op, args = request["op"], request.get("args", {})
    try:
        if op == "setup":
            result = _setup(**args)
        elif op == "open":
            result = _open(**args)
        elif op == "goto":
            result = _move(line_number=args["line_number"])
        elif op == "scroll_down":
            result = _move(delta=_STATE["window"] - 2)
        elif op == "scroll_up":
            result = _move(delta=-(_STATE["window"] - 2))
        elif op == "create":
            result = _create(**args)
        elif op == "edit":
            result = _edit(**args)
        elif op == "run":
            result = _command_text(_run_child(["/bin/bash", "-c", args["command"]], args["timeout_s"],
                                              args["max_chars"]), args["timeout_s"])
        elif op == "python":
            result = _command_text(_run_child([sys.executable, "-"], args["timeout_s"], args["max_chars"],
                                              stdin=args["code"]), args["timeout_s"])
        elif op == "read_files":
            result = _read_files(**args)
        elif op == "grade":
            result = _grade(**args)
        elif op == "serve_submission":
            result = _serve_submission(**args)
        else:
            raise ValueError(f"unknown op {op!r}")
        reply = {"ok": True, "result": result}
    except Exception as e:  # the agent's arguments (a bad line number, a missing file): an error it can read
        reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    sys.stdout.write(json.dumps(reply) + "\n")
