"""Fork benchmark: what forking a Python-tool episode costs, in time and memory (docs/branching.md).

A parent episode builds ~100 MB of live objects in its REPL in one of two ways — ``fast`` (one ``bytearray`` and a
numpy-free list of ints: cheap to build) and ``slow`` (2 million small strings: the kind of state that takes a while)
— then ``env.fork(k)`` makes k siblings and each sibling runs one small call.

Each workload is forked both ways the Python tool can (``SandboxConfig(fork=...)``), in the same run:

* ``replay``: the sibling's first call starts a REPL in a sandbox of its own and re-runs the parent's calls;
* ``copy``: a copy-on-write fork of the live sandboxed REPL (``gym_llm/tools/sandbox/family.py``), made during
  ``env.fork(k)``; the copies live in the parent's sandbox.

Measured: ``env.fork(k)`` per sibling; a sibling ready = ``env.fork(k) / k`` + its first call - the parent's same call
(the baseline); the parent's own time to build the state (what a replay re-runs); memory: the proportional set size
(PSS) of every process of each sandbox (from /proc), for the parent alone and for the parent with its k siblings.

Targets (issue 23): a fork of 100 MB of live objects ready in <= 50 ms, and 8 siblings in < 2x the memory of one.

A second table measures the building block alone (``gym_llm/tools/sandbox/cowfork.py``) on a plain, unsandboxed
REPL-like process: the time until a copy is set up and let go, its first call's round trip, and the PSS of the parent
and its k copies against the parent alone.

Run: ``python bench/fork.py [--k 8] [--workload fast,slow]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

WORKLOADS = {
    "fast": "blob = bytearray(80 << 20)\nints = list(range(700_000))\nprint(len(blob) + len(ints))",
    "slow": "words = [f'w{i:07d}' for i in range(2_000_000)]\nprint(len(words))",
}
PROBE = "print(sum(1 for name in dir() if not name.startswith('_')))"


def _code(source: str) -> str:
    return f"```python\n{source}\n```"


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def _pss_mb(pids: list[int]) -> float:
    total_kb = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
        except OSError:
            pass
    return total_kb / 1024


def _sandbox_mb(env) -> float:
    """PSS of every process of the sandbox the episode's REPL runs in (bwrap, its init, zygote, relays, REPLs)."""
    sessions = env.episode.resources["gym_llm.tools"]._sessions
    (session,) = sessions.values()
    return _pss_mb(_descendants(session._sandbox.process.pid))


def _step_s(env, source: str) -> float:
    start = time.perf_counter()
    env.step(_code(source))
    elapsed = time.perf_counter() - start
    content = env.episode.messages[-1].content
    if "Error" in content or "Traceback" in content:
        raise RuntimeError(f"the benchmark's code failed in the sandbox: {content[:500]}")
    return elapsed


def bench(workload: str, k: int, mode: str = "replay") -> dict[str, float]:
    """``mode``: ``"replay"`` (each sibling re-runs the parent's calls in a sandbox of its own) or ``"copy"``
    (copy-on-write forks of the live sandboxed REPL, all in the parent's sandbox: its PSS then covers the family)."""
    from gym_llm.envs.chat import LLMChatEnv
    from gym_llm.tools import PythonTool

    tool = PythonTool(min_idle=0, memory_limit_mb=1024, timeout_s=120, cpu_limit_s=600, fork=mode)
    env = LLMChatEnv(prompts=["Use Python."], tools=[tool], max_turns=20)
    env.reset(seed=0)
    build_s = _step_s(env, WORKLOADS[workload])
    parent_call_s = statistics.median(_step_s(env, PROBE) for _ in range(3))
    parent_mb = _sandbox_mb(env)
    start = time.perf_counter()
    siblings = env.fork(k)
    fork_s = time.perf_counter() - start
    first_calls = [_step_s(sibling, PROBE) for sibling in siblings]
    if mode == "copy":
        family_mb = _sandbox_mb(env)  # the copies are processes of the parent's sandbox
    else:
        family_mb = parent_mb + sum(_sandbox_mb(sibling) for sibling in siblings)
    for sibling in siblings:
        sibling.close()
    env.close()
    return {"build_s": build_s, "parent_call_s": parent_call_s, "fork_s": fork_s,
            "first_call_s": statistics.median(first_calls), "parent_mb": parent_mb, "family_mb": family_mb}


_REPL_LIKE = """
import os, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
ns = {}
while True:
    code = sock.recv(1 << 20)
    if not code:
        break
    import contextlib, io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code.decode(), ns)
    sock.send(out.getvalue().encode() or b"-")
"""


def bench_cow(workload: str, k: int) -> dict[str, float]:
    """The copy-on-write primitive on a plain (unsandboxed) REPL-like process holding ``workload``'s state."""
    import socket
    import subprocess
    import sys

    from gym_llm.tools.sandbox.cowfork import cow_fork

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    process = subprocess.Popen([sys.executable, "-c", _REPL_LIKE, str(theirs.fileno())], pass_fds=[theirs.fileno()])
    fd = theirs.fileno()
    theirs.close()

    def ask(sock, code: str) -> float:
        start = time.perf_counter()
        sock.send(code.encode())
        sock.recv(1 << 20)
        return time.perf_counter() - start

    try:
        ask(ours, WORKLOADS[workload])
        parent_call_s = statistics.median(ask(ours, PROBE) for _ in range(3))
        parent_mb = _pss_mb([process.pid])
        copies = [cow_fork(process.pid, channel_fd=fd, channel_type=socket.SOCK_SEQPACKET) for _ in range(k)]
        first_calls = [ask(copy.channel, PROBE) for copy in copies]
        family_mb = _pss_mb([process.pid, *(copy.pid for copy in copies)])
        for copy in copies:
            copy.channel.close()
            os.waitpid(copy.pid, 0)
    finally:
        ours.close()
        process.wait(timeout=60)
    return {"ready_s": statistics.median(c.ready_s for c in copies), "ready_max_s": max(c.ready_s for c in copies),
            "stopped_s": statistics.median(c.parent_stopped_s for c in copies), "parent_call_s": parent_call_s,
            "first_call_s": statistics.median(first_calls), "parent_mb": parent_mb, "family_mb": family_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=8, help="siblings per fork")
    parser.add_argument("--workload", default="fast,slow", help=f"comma-separated: {', '.join(WORKLOADS)}")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the record here (bench/results/fork.json; see scripts/render_benchmarks.py)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; k={args.k}; PSS summed over each sandbox's processes")
    print("\n| workload | fork by | parent builds its state | fork() per sibling | sibling ready (fork() / k + first "
          "call - parent's same call) | memory, parent | memory, parent + k siblings | memory ratio |")
    print("|---|---|---|---|---|---|---|---|")
    reexec, figures, rows = {}, {"sandboxed": {}, "cowfork": {}}, []
    for workload in args.workload.split(","):
        for mode in ("replay", "copy"):
            r = bench(workload.strip(), args.k, mode)
            figures["sandboxed"].setdefault(workload, {})[mode] = r
            if mode == "replay":
                reexec[workload] = r
            ready_ms = 1000 * (r["fork_s"] / args.k + r["first_call_s"] - r["parent_call_s"])
            print(f"| {workload} | {mode} | {1000 * r['build_s']:.0f} ms | {1000 * r['fork_s'] / args.k:.2f} ms "
                  f"| {ready_ms:.0f} ms (target <= 50) | {r['parent_mb']:.0f} MB | {r['family_mb']:.0f} MB "
                  f"| {r['family_mb'] / r['parent_mb']:.2f}x (target for 8 siblings: < 2x) |", flush=True)
    print("\nThe copy-on-write building block alone (cowfork.py) on a plain, unsandboxed REPL-like process:")
    print("\n| workload | copy set up and let go (median / max) | parent stopped | first call, copy / parent "
          "| memory, parent | memory, parent + k copies | memory ratio | ready vs re-execution |")
    print("|---|---|---|---|---|---|---|---|")
    for workload in args.workload.split(","):
        r = bench_cow(workload.strip(), args.k)
        old = reexec[workload]
        base = old["first_call_s"] - old["parent_call_s"] + old["fork_s"] / args.k
        print(f"| {workload} | {1000 * r['ready_s']:.1f} / {1000 * r['ready_max_s']:.1f} ms | "
              f"{1000 * r['stopped_s']:.1f} ms | {1000 * r['first_call_s']:.1f} / {1000 * r['parent_call_s']:.1f} ms "
              f"| {r['parent_mb']:.0f} MB | {r['family_mb']:.0f} MB | {r['family_mb'] / r['parent_mb']:.2f}x "
              f"| {base / r['ready_s']:.0f}x faster |", flush=True)
        figures["cowfork"][workload] = r
    if args.json:
        from _common import bench_record, write_record

        def ready_ms(r: dict) -> float:
            return 1000 * (r["fork_s"] / args.k + r["first_call_s"] - r["parent_call_s"])

        for workload, modes in figures["sandboxed"].items():
            copy, replay = modes["copy"], modes["replay"]
            rows.append({
                "what": f"forking a Python-tool episode ({workload} workload, {args.k} siblings): a copy-on-write fork "
                        "of the live sandboxed REPL (the default)",
                "ours": f"a sibling ready after **{ready_ms(copy):.0f} ms** (state built in "
                        f"{1000 * copy['build_s']:.0f} ms); the parent + {args.k} siblings {copy['family_mb']:.0f} MB",
                "baseline": f"re-execution (`fork=\"replay\"`), same run: ready after {ready_ms(replay):.0f} ms, "
                            f"{replay['family_mb']:.0f} MB; the parent alone {copy['parent_mb']:.0f} MB",
                "ratio": f"**{ready_ms(replay) / ready_ms(copy):.0f}x** faster than re-execution; memory "
                         f"**{copy['family_mb'] / copy['parent_mb']:.2f}x** the parent alone",
                "target": "ready ≤ 50 ms; memory < 2x",
                **({"headline": True, "headline_what": f"forking a live sandboxed Python REPL ({args.k} siblings)",
                    "headline_ratio": f"a sibling ready in {ready_ms(copy):.0f} ms, "
                                      f"**{ready_ms(replay) / ready_ms(copy):.0f}x** faster than re-execution; "
                                      f"{copy['family_mb'] / copy['parent_mb']:.2f}x the memory"}
                   if not rows else {})})
        write_record(args.json, bench_record("fork.py", title="Forking a Python-tool episode", order=110, rows=rows,
                                             figures=figures))


if __name__ == "__main__":
    main()
