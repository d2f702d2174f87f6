"""Ray collector scaling: rollout throughput with 1 and 2 env workers, against in-process collectors.

The engine is :class:`FixedLatencyEngine`: a real implementation of the Engine protocol that answers every
``generate`` call after a fixed latency with deterministic tokens, whatever the batch size — an idealised
inference server that batches concurrent requests. It keeps the model out of the measurement, so on a
small CPU machine the numbers show the framework: whether env workers step in parallel and overlap with
generation, and what the Ray hops cost.

Two scenarios, each with ``--num-envs`` (N) sub-envs per env (worker):

* ``tool`` — engine-bound. ``LLMPythonTool-v0`` (tokens mode, 3 turns: two sandboxed tool runs of a
  ``--work``-iteration CPU loop, then a scored reply), engine latency ``--latency-s`` (0.3 s) against an env
  step of ~0.05 s. Here the 1 → 2 worker gain comes from the engine serving both workers' calls at once
  (two workers = twice the prompts per engine latency), not from env steps running in parallel: a second
  worker's env steps fit into the first one's engine waits even on one core.
* ``verifier`` — env-bound. ``LLMChat-v0`` (tokens mode, one turn) whose reward function is pure-Python
  CPU work (``--verify-work`` loop iterations per sub-env, holding the GIL like most Python verifiers):
  an env step of ~0.1 s, twice the engine latency ``--verify-latency-s`` (0.05 s).

For each scenario the bench prints the *no-parallel-env bound* ``2 (L + E) / max(L + E, 2E)`` (``L`` the
engine latency, ``E`` ray x1's env step): the best ray x2 / ray x1 if the two workers' env steps could never
run at the same time (perfectly interleaved on one core). In ``tool`` it is 2.0, so the ratio says nothing
about env parallelism; in ``verifier`` it is ~1.5, so a ratio above it shows env workers stepping in
parallel in separate processes.

Configurations (same engine and batch size ``N``):

* ``in-process N``: the local :class:`~gym_llm_adapters.collector.Collector`, one env of ``N``;
* ``in-process 2N``: one env of ``2N`` sub-envs — as many as ``ray x2`` (twice the prompts per call);
* ``in-process 2xN overlap``: two envs of ``N`` with ``overlap=True`` — one env steps in a thread while the
  engine generates for the other (the in-process way to hide env time);
* ``ray x1`` / ``ray x2``: :class:`~gym_llm_adapters.ray.RayCollector` with 1 / 2 env worker actors (``N`` each)
  sharing one engine actor (thread-safe, so concurrent calls each take the latency, like a batching server).

Each configuration is timed for ``--seconds`` per repeat; repeats alternate the order so drifting load hits
all of them alike; medians are reported with the ratios of ``ray x2`` to each baseline, all measured in the
same run. The issue's target is ray x2 / ray x1 >= 1.7; read it against the bound: in ``tool`` it measures
the engine serving two workers at once, in ``verifier`` the env workers stepping in parallel.

    python bench/ray_scaling.py
    python bench/ray_scaling.py --scenario verifier --seconds 20 --repeats 5
    python bench/ray_scaling.py --address auto      # on a running cluster (ray start --head)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "adapters")]

import numpy as np  # noqa: E402

from gym_llm_adapters.engines import cpu_paths  # noqa: E402
from gym_llm_adapters.engines.base import EngineBase, SamplingConfig  # noqa: E402
from gym_llm_adapters.types import Completion  # noqa: E402

CODE = "```python\ntotal = 0\nfor i in range({work}):\n    total += i * i % 7\nprint(total)\n```"
CONFIGS = ("in-process N", "in-process 2N", "in-process 2xN overlap", "ray x1", "ray x2")


class FixedLatencyEngine(EngineBase):
    """An engine that takes ``latency_s`` per ``generate`` call, whatever the batch, and always replies ``reply``.

    Completions carry the reply's token ids, log-probs of 0.0 and the engine's version; ``logprobs`` gives
    zeros and ``load_weights`` only bumps the version. A benchmark instrument: it stands for an inference
    server whose batch latency does not depend on the batch size.
    """

    def __init__(self, tokenizer: Any, *, reply: str, latency_s: float, version: int = 0):
        super().__init__(tokenizer, version=version)
        self.reply_ids = np.asarray(tokenizer.encode(reply, add_special_tokens=False), dtype=np.int64)
        self.latency_s = float(latency_s)

    def _generate_ids(self, prompts: list[np.ndarray], sampling: SamplingConfig) -> list[Completion]:
        time.sleep(self.latency_s)
        ids = self.reply_ids[: sampling.max_tokens]
        reason = "stop" if len(ids) == len(self.reply_ids) else "length"
        return [self._completion(p, ids, np.zeros(len(ids), dtype=np.float32), reason, sampling)
                for p in prompts for _ in range(sampling.n)]

    def logprobs(self, sequences: Sequence[Any]) -> list[np.ndarray]:
        return [np.zeros(len(s), dtype=np.float32) for s in sequences]

    def _load_weights(self, items: list[tuple[str, Any]]) -> None:
        pass


class PythonVerifier:
    """A reward function doing ``work`` iterations of pure-Python arithmetic per call (it holds the GIL, like
    most verifiers written in Python); the reward is 1.0. Pickled to the env workers by value."""

    def __init__(self, work: int):
        self.work = int(work)

    def __call__(self, task: Any, messages: Any) -> float:
        total = 0
        for i in range(self.work):
            total += i * i % 7
        return 1.0 if total >= 0 else 0.0


@dataclass(frozen=True)
class Scenario:
    name: str
    env_id: str
    env_kwargs: dict[str, Any]
    reply: str
    latency_s: float


def scenarios(args, tokenizer) -> list[Scenario]:
    common = dict(group_size=args.group_size, mode="tokens", tokenizer=tokenizer)
    tool_tasks = [{"question": f"What is {a} plus {a + 1}?", "answer": f"#### {2 * a + 1}"} for a in range(200)]
    tool = Scenario("tool", "LLMPythonTool-v0",
                    dict(tasks=tool_tasks, max_turns=3, max_action_tokens=256, max_seq_len=2048, **common),
                    CODE.format(work=args.work), args.latency_s)
    chat_prompts = [f"Is {a} a prime number?" for a in range(200)]
    verifier = Scenario("verifier", "LLMChat-v0",
                        dict(prompts=chat_prompts, max_turns=1, max_action_tokens=64, max_seq_len=256,
                             reward_fn=PythonVerifier(args.verify_work),
                             # in the env's thread, as in the README's runs: this measures Ray's scaling of env CPU
                             # work, not where a hook runs (the default deadline worker is measured by grading.py)
                             reward_timeout_s=None, **common),
                        "Let me check the divisors one by one: it is not.", args.verify_latency_s)
    return [s for s in (tool, verifier) if args.scenario in (s.name, "both")]


def rate(collector, seconds: float) -> float:
    """Episodes per second over batches collected for about ``seconds``. The first batch is not timed: a Ray
    worker keeps one step in flight while the other configurations run, which would flatter it."""
    collector.next_batch()
    episodes, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        episodes += len(collector.next_batch())
    return episodes / (time.perf_counter() - start)


def run(scenario: Scenario, args, ray) -> dict[str, Any]:
    import gymnasium as gym

    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.ray import EngineGroup, EngineSpec, EnvSpec, RayCollector

    tok = scenario.env_kwargs["tokenizer"]
    N, sampling = args.num_envs, SamplingConfig(max_tokens=scenario.env_kwargs["max_action_tokens"])
    engine_args = dict(reply=scenario.reply, latency_s=scenario.latency_s)

    def local_env(num_envs: int):
        return gym.make_vec(scenario.env_id, num_envs=num_envs, **scenario.env_kwargs)

    def local(envs: Any, **kwargs: Any) -> Collector:
        return Collector(envs, FixedLatencyEngine(tok, **engine_args), sampling, episodes_per_batch=N, seed=0, **kwargs)

    engines = EngineGroup(EngineSpec(FixedLatencyEngine, tok, **engine_args, thread_safe=True), max_concurrency=8)
    spec = EnvSpec(scenario.env_id, num_envs=N, **scenario.env_kwargs)
    configs = {"in-process N": local(local_env(N)), "in-process 2N": local(local_env(2 * N)),
               "in-process 2xN overlap": local([local_env(N), local_env(N)], overlap=True),
               "ray x1": RayCollector(spec, engines, sampling, num_workers=1, episodes_per_batch=N, seed=0),
               "ray x2": RayCollector(spec, engines, sampling, num_workers=2, episodes_per_batch=N, seed=0)}
    print(f"\n## {scenario.name}: {scenario.env_id}, N={N}, G={args.group_size}, engine latency "
          f"{scenario.latency_s:.2f} s/call (load average {os.getloadavg()[0]:.1f})", flush=True)
    for collector in configs.values():  # warm-up: sandboxes started, first tool runs done
        collector.collect(2)
    rates: dict[str, list[float]] = {name: [] for name in configs}
    for repeat in range(args.repeats):
        for name in (CONFIGS if repeat % 2 == 0 else CONFIGS[::-1]):
            rates[name].append(rate(configs[name], args.seconds))
        print(f"  repeat {repeat}: " + "   ".join(f"{n} {rates[n][-1]:.2f}" for n in CONFIGS)
              + f" ep/s   (load average {os.getloadavg()[0]:.1f})", flush=True)
    step_s = {name: (c.stats.env_s / max(1, c.stats.env_steps), c.stats.generate_s / max(1, c.stats.env_steps))
              for name, c in configs.items()}
    for collector in configs.values():
        collector.close()
    engines.close()
    return {"scenario": scenario.name, "latency_s": scenario.latency_s, **report(rates, step_s, scenario.latency_s)}


def report(rates: dict[str, list[float]], step_s: dict[str, tuple[float, float]], latency_s: float) -> dict[str, Any]:
    """Prints the scenario's table and ratios; returns them (the figures of the JSON record)."""
    def ratio(a: str, b: str) -> float:  # median of the per-repeat ratios (both measured back to back)
        return statistics.median(y / x for x, y in zip(rates[b], rates[a]))

    print("\n| configuration | episodes/s (median) | env step (s) | generate call (s) |")
    print("|---|---|---|---|")
    for name in CONFIGS:
        print(f"| {name} | {statistics.median(rates[name]):.2f} | {step_s[name][0]:.3f} | {step_s[name][1]:.3f} |")
    env_s = step_s["ray x1"][0]
    bound = 2 * (latency_s + env_s) / max(latency_s + env_s, 2 * env_s)
    print(f"\nray x2 / ray x1 = {ratio('ray x2', 'ray x1'):.2f} (target >= 1.7; no-parallel-env bound {bound:.2f}: the "
          "most two workers whose env steps never ran at the same time could get)")
    print(f"ray x2 / in-process 2N = {ratio('ray x2', 'in-process 2N'):.2f}")
    print(f"ray x2 / in-process 2xN overlap = {ratio('ray x2', 'in-process 2xN overlap'):.2f}")
    print(f"ray x1 / in-process N = {ratio('ray x1', 'in-process N'):.2f} (the Ray hops' cost)")
    return {"episodes_per_s": {name: statistics.median(rates[name]) for name in CONFIGS}, "step_s": step_s,
            "x2_over_x1": ratio("ray x2", "ray x1"), "bound": bound,
            "x2_over_in_process_2n": ratio("ray x2", "in-process 2N"),
            "x2_over_overlap": ratio("ray x2", "in-process 2xN overlap"),
            "x1_over_in_process_n": ratio("ray x1", "in-process N")}


def table_row(result: dict[str, Any]) -> dict[str, Any]:
    """A scenario's row of the benchmark document (the env-bound verifier's is a headline)."""
    rates = result["episodes_per_s"]
    kind = {"tool": f"engine-bound (tool, L={result['latency_s']:g} s)", "verifier": "env-bound (Python verifier)"}
    row = {"what": f"Ray scale-out, {kind.get(result['scenario'], result['scenario'])}",
           "ours": f"2 env workers {rates['ray x2']:.1f} ep/s",
           "baseline": f"1 worker {rates['ray x1']:.1f} ep/s; in-process 2N {rates['in-process 2N']:.1f}, overlap "
                       f"{rates['in-process 2xN overlap']:.1f} ep/s",
           "ratio": f"**{result['x2_over_x1']:.2f}x** (no-parallel-env bound {result['bound']:.2f})",
           "target": "≥ 1.7x"}
    if result["scenario"] == "verifier":
        row.update(headline=True, headline_what="Ray scale-out, env-bound, 2 env workers",
                   headline_ratio=f"**{result['x2_over_x1']:.2f}x** one worker")
    return row

def start_ray(address: str | None) -> Any:
    import ray

    if address:
        ray.init(address=address)
        return ray
    saved = os.environ.get("PYTHONPATH")  # the actors import this checkout
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "adapters")] + ([saved] if saved else []))
    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    return ray


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=("tool", "verifier", "both"), default="both")
    parser.add_argument("--num-envs", type=int, default=8, help="sub-envs per env worker (and in-process env)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--latency-s", type=float, default=0.3, help="tool: the engine's fixed time per call")
    parser.add_argument("--work", type=int, default=50_000, help="tool: loop iterations of each sandboxed tool call")
    parser.add_argument("--verify-latency-s", type=float, default=0.05, help="verifier: the engine's time per call")
    parser.add_argument("--verify-work", type=int, default=170_000,
                        help="verifier: pure-Python loop iterations per sub-env step (~0.1 s per step of 8 here)")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed collection per configuration and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the record here (bench/results/ray_scaling.json; see "
                             "scripts/render_benchmarks.py)")
    args = parser.parse_args()

    import gym_llm  # noqa: F401
    from gym_llm_adapters.models.tokenizers import tiny_tokenizer

    tok = tiny_tokenizer()
    print(f"machine: {cpu_paths.describe()}")  # every number below is this machine's
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {args.seconds:.0f} s x {args.repeats} "
          "repeats per configuration", flush=True)
    ray = start_ray(args.address)
    try:
        results = [run(scenario, args, ray) for scenario in scenarios(args, tok)]
    finally:
        ray.shutdown()
    if args.json:
        from _common import bench_record, write_record

        write_record(args.json, bench_record("ray_scaling.py", title="Ray scale-out", order=90,
                                             rows=[table_row(result) for result in results], figures=results))


if __name__ == "__main__":
    main()
