"""Python tool benchmark: gym-llm's sandboxed LLMPythonTool-v0 vs TorchRL's PythonInterpreter.

Both sides run the same episodes at batch B (default 8): reset, one assistant turn with a short
```python block, then a final answer. gym-llm: the native vector env, each call in the episode's
persistent REPL inside bubblewrap + seccomp + rlimits, calls of all sub-envs in parallel. TorchRL:
``ChatEnv(batch_size=(B,), input_mode="history")`` + ``PythonInterpreter()`` (its default: no sandbox,
one ``python`` subprocess per code block, sub-envs one after another); optionally also its
``persistent=True`` mode.

Measured in the same run: per-call tool latency (p50, p95; host wall time of the whole call,
including, for gym-llm, getting a sandbox and forking the episode's REPL on its first call) and
episodes/s. Run: ``python bench/python_tool.py [--batch 8] [--rounds 30] [--torchrl-rounds 6]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

SNIPPET = "total = sum(i * i for i in range({n}))\nprint(total)"


@dataclass
class Result:
    name: str
    latencies_s: list[float]
    episodes: int
    wall_s: float

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def row(self) -> str:
        return (f"| {self.name} | {self.percentile(0.5) * 1e3:.2f} | {self.percentile(0.95) * 1e3:.2f} | "
                f"{self.episodes_per_s:.1f} |")


def tasks(n: int) -> list[dict]:
    return [{"question": f"What is the sum of i*i for i below {k}?", "answer": f"#### {sum(i * i for i in range(k))}"}
            for k in range(10, 10 + n)]


def run_gym_llm(batch: int, rounds: int) -> Result:
    from gym_llm.envs.python_tool import LLMPythonToolVectorEnv
    from gym_llm.tools.python import PythonSession

    latencies: list[float] = []
    original = PythonSession.run

    def timed(self, call):
        start = time.perf_counter()
        try:
            return original(self, call)
        finally:
            latencies.append(time.perf_counter() - start)

    PythonSession.run = timed
    envs = LLMPythonToolVectorEnv(batch, tasks=tasks(batch * 4), max_turns=3)
    try:
        envs.parts.extra["python_tool"].pool.prewarm(batch + 1, wait=True)
        envs.reset(seed=0)

        def round_() -> None:
            codes = tuple(f"Let me compute.\n```python\n{SNIPPET.format(n=10 + i)}\n```" for i in range(batch))
            envs.step(codes)
            _, reward, terminated, _, _ = envs.step(tuple(f"#### {sum(j * j for j in range(10 + i))}" for i in range(batch)))
            assert terminated.all()

        round_()  # warm-up
        latencies.clear()
        start = time.perf_counter()
        for _ in range(rounds):
            round_()
        wall = time.perf_counter() - start
    finally:
        envs.close()
        PythonSession.run = original
    return Result("gym-llm LLMPythonTool-v0 (bwrap sandbox, persistent REPL)", latencies, rounds * batch, wall)


def warm_call_latency(calls: int = 300) -> Result:
    """One episode's warm REPL, calls one after another: the sandbox's own per-call overhead."""
    from gym_llm.tools import PythonTool, ToolCall

    tool = PythonTool(min_idle=0)
    tool.attach()
    session = tool.open_session()
    latencies = []
    try:
        session.run(ToolCall("python", {"code": "x = 0"}))
        start = time.perf_counter()
        for _ in range(calls):
            t0 = time.perf_counter()
            session.run(ToolCall("python", {"code": "x += 1"}))
            latencies.append(time.perf_counter() - t0)
        wall = time.perf_counter() - start
    finally:
        session.close()
        tool.detach()
    return Result("gym-llm, one warm REPL, sequential calls", latencies, 0, wall)


def run_torchrl(batch: int, rounds: int, persistent: bool) -> Result:
    import logging

    logging.getLogger("torchrl").setLevel(logging.WARNING)  # it logs every block's output at INFO
    from tensordict import TensorDict, set_list_to_stack
    from torchrl.data.llm import History
    from torchrl.envs.llm import ChatEnv
    from torchrl.envs.llm.transforms import PythonInterpreter

    set_list_to_stack(True).set()
    interpreter = PythonInterpreter(persistent=persistent)
    latencies: list[float] = []
    original = interpreter._execute_python_code

    def timed(code, i):
        start = time.perf_counter()
        try:
            return original(code, i)
        finally:
            latencies.append(time.perf_counter() - start)

    interpreter._execute_python_code = timed
    env = ChatEnv(batch_size=(batch,), system_prompt="You can run Python.", input_mode="history")
    env = env.append_transform(interpreter)

    def reply(td, contents):
        history = td["history"]
        response = History(role=["assistant"] * batch, content=list(contents), batch_size=(batch,)).unsqueeze(-1)
        history.full = history.prompt.extend(response, dim=-1, inplace=False)
        history.response = response
        return env.step(td)["next"]

    def round_() -> None:
        td = env.reset(TensorDict({"query": [t["question"] for t in tasks(batch)]}, batch_size=(batch,)))
        td = reply(td, [f"Let me compute.\n```python\n{SNIPPET.format(n=10 + i)}\n```" for i in range(batch)])
        assert "executed successfully" in td["history"].prompt[0].content[-1]
        reply(td, [f"#### {sum(j * j for j in range(10 + i))}" for i in range(batch)])

    try:
        round_()  # warm-up
        latencies.clear()
        start = time.perf_counter()
        for _ in range(rounds):
            round_()
        wall = time.perf_counter() - start
    finally:
        env.close()
        interpreter.close()
    mode = "persistent=True (a process per episode)" if persistent else "default (a subprocess per block)"
    return Result(f"TorchRL PythonInterpreter, {mode}, unsandboxed", latencies, rounds * batch, wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8, help="B, episodes stepped together")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (B episodes each) for gym-llm")
    parser.add_argument("--torchrl-rounds", type=int, default=6, help="timed rounds for TorchRL")
    parser.add_argument("--no-persistent", action="store_true", help="skip TorchRL's persistent mode")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the record here (bench/results/python_tool.json; see "
                             "scripts/render_benchmarks.py)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from gym_llm_adapters.engines import cpu_paths

    print(f"machine: {cpu_paths.describe()}")  # every number below is this machine's
    print(f"B={args.batch}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (other jobs skew timings)")
    ours = run_gym_llm(args.batch, args.rounds)
    baselines = [run_torchrl(args.batch, args.torchrl_rounds, persistent=False)]
    if not args.no_persistent:
        baselines.append(run_torchrl(args.batch, args.torchrl_rounds, persistent=True))
    print("\n| tool | call p50 (ms) | call p95 (ms) | episodes/s |\n|---|---:|---:|---:|")
    for result in (ours, *baselines):
        print(result.row())
    print()
    for base in baselines:
        print(f"throughput ratio gym-llm / {base.name}: {ours.episodes_per_s / base.episodes_per_s:.1f}x "
              f"(p50 latency ratio {base.percentile(0.5) / ours.percentile(0.5):.1f}x)")
    print(f"gym-llm call latency mean {statistics.mean(ours.latencies_s) * 1e3:.2f} ms over {len(ours.latencies_s)} calls")
    warm = warm_call_latency()
    print(f"{warm.name}: p50 {warm.percentile(0.5) * 1e3:.3f} ms, p95 {warm.percentile(0.95) * 1e3:.3f} ms "
          f"over {len(warm.latencies_s)} calls")
    if args.json:
        write_json(args.json, args.batch, ours, baselines, warm)


def write_json(path: str, batch: int, ours: Result, baselines: list[Result], warm: Result) -> None:
    """The record of this run (the first baseline, TorchRL's subprocess-per-block mode, is the headline's)."""
    from _common import bench_record, write_record

    def figures(result: Result) -> dict:
        return {"name": result.name, "episodes_per_s": result.episodes_per_s, "p50_ms": result.percentile(0.5) * 1e3,
                "p95_ms": result.percentile(0.95) * 1e3, "calls": len(result.latencies_s)}

    rows = [{"what": f"Python tool, B={batch}, episodes/s ({base.name})",
             "ours": f"{ours.episodes_per_s:.0f} ep/s, call p50 {ours.percentile(0.5) * 1e3:.1f} ms (sandboxed)",
             "baseline": f"{base.episodes_per_s:.1f} ep/s, p50 {base.percentile(0.5) * 1e3:.1f} ms",
             "ratio": f"**{ours.episodes_per_s / base.episodes_per_s:.1f}x**", "target": "≥ 3x",
             **({"headline": True, "headline_what": f"Python tool episodes/s, B={batch} (sandboxed)",
                 "headline_ratio": f"**{ours.episodes_per_s / base.episodes_per_s:.1f}x** TorchRL's "
                                   "`PythonInterpreter` (unsandboxed)"} if i == 0 else {})}
            for i, base in enumerate(baselines)]
    write_record(path, bench_record("python_tool.py", title="Python tool: episodes per second", order=20, rows=rows,
                                    figures={"ours": figures(ours), "baselines": [figures(b) for b in baselines],
                                             "warm_call": figures(warm)}))


if __name__ == "__main__":
    main()
