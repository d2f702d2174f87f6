"""Ray collector scaling: rollout throughput with 1 and 2 env workers, against the in-process collector.

The env is ``LLMPythonTool-v0`` (tokens mode): every reply of the policy is a ```python block that the env
runs in its bubblewrap sandbox (a CPU loop of ``--work`` iterations, one sandboxed REPL per sub-env), for
``max_turns=3`` turns (two tool runs, then the reply is scored). The engine is :class:`FixedLatencyEngine`:
a real implementation of the Engine protocol that answers every ``generate`` call after a fixed
``--latency-s`` with deterministic tokens, whatever the batch size — an idealised inference server that
batches concurrent requests. It keeps the model out of the measurement, so on a small CPU machine the
numbers show the framework: whether env workers step in parallel and overlap with generation, and what the
Ray hops cost.

Configurations, each with ``--num-envs`` sub-envs per env (worker):

* in-process: the local :class:`~gym_llm_adapters.collector.Collector`, one env, the engine in-process;
* ray x1 / ray x2: :class:`~gym_llm_adapters.ray.RayCollector` with 1 / 2 env worker actors sharing one engine
  actor (thread-safe, so concurrent calls each take ``--latency-s``, like a batching server).

Each is timed for ``--seconds`` per repeat; repeats alternate the configurations so drifting load hits all
of them alike; the medians are reported. Prints episodes/s of each and the ratios ray x2 / ray x1 (target
>= 1.7) and ray x1 / in-process (the Ray hops' cost).

    python bench/ray_scaling.py
    python bench/ray_scaling.py --latency-s 0.5 --num-envs 16 --seconds 20 --repeats 5
    python bench/ray_scaling.py --address auto      # on a running cluster (ray start --head)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "adapters")]

import numpy as np  # noqa: E402

from gym_llm_adapters.engines.base import EngineBase, SamplingConfig  # noqa: E402
from gym_llm_adapters.types import Completion  # noqa: E402

CODE = "```python\ntotal = 0\nfor i in range({work}):\n    total += i * i % 7\nprint(total)\n```"


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


def env_kwargs(args, tokenizer) -> dict[str, Any]:
    tasks = [{"question": f"What is {a} plus {a + 1}?", "answer": f"#### {2 * a + 1}"} for a in range(200)]
    return dict(group_size=args.group_size, tasks=tasks, mode="tokens", tokenizer=tokenizer, max_turns=3,
                max_action_tokens=256, max_seq_len=2048)


def rate(collector, seconds: float) -> float:
    """Episodes per second over batches collected for about ``seconds``. The first batch is not timed: a Ray
    worker keeps one step in flight while the other configurations run, which would flatter it."""
    collector.next_batch()
    episodes, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        episodes += len(collector.next_batch())
    return episodes / (time.perf_counter() - start)


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
    parser.add_argument("--num-envs", type=int, default=8, help="sub-envs per env worker (and in-process)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--latency-s", type=float, default=0.3, help="the engine's fixed time per generate call")
    parser.add_argument("--work", type=int, default=50_000, help="loop iterations of each sandboxed tool call")
    parser.add_argument("--seconds", type=float, default=12.0, help="timed collection per configuration and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")
    args = parser.parse_args()

    import gymnasium as gym

    import gym_llm  # noqa: F401
    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.models.tokenizers import tiny_tokenizer
    from gym_llm_adapters.ray import EngineGroup, EngineSpec, EnvSpec, RayCollector

    tok = tiny_tokenizer()
    reply = CODE.format(work=args.work)
    sampling = SamplingConfig(max_tokens=256)
    batch = args.num_envs
    print(f"LLMPythonTool-v0 tokens mode, N={args.num_envs} sub-envs per env, G={args.group_size}, engine latency "
          f"{args.latency_s:.2f} s/call, tool loop {args.work} iterations; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)

    local_env = gym.make_vec("LLMPythonTool-v0", num_envs=args.num_envs, **env_kwargs(args, tok))
    local = Collector(local_env, FixedLatencyEngine(tok, reply=reply, latency_s=args.latency_s), sampling,
                      episodes_per_batch=batch, seed=0)
    ray = start_ray(args.address)
    engines = EngineGroup(EngineSpec(FixedLatencyEngine, tok, reply=reply, latency_s=args.latency_s, thread_safe=True),
                          max_concurrency=8)
    spec = EnvSpec("LLMPythonTool-v0", num_envs=args.num_envs, **env_kwargs(args, tok))
    configs = {"in-process": local,
               "ray x1": RayCollector(spec, engines, sampling, num_workers=1, episodes_per_batch=batch, seed=0),
               "ray x2": RayCollector(spec, engines, sampling, num_workers=2, episodes_per_batch=batch, seed=0)}
    for collector in configs.values():  # warm-up: sandboxes started, first tool runs done
        collector.collect(2)
    rates: dict[str, list[float]] = {name: [] for name in configs}
    for repeat in range(args.repeats):
        order = list(configs) if repeat % 2 == 0 else list(reversed(configs))
        for name in order:
            rates[name].append(rate(configs[name], args.seconds))
        print(f"  repeat {repeat}: " + "   ".join(f"{n} {rates[n][-1]:6.2f} ep/s" for n in configs)
              + f"   (load average {os.getloadavg()[0]:.1f})", flush=True)
    steps = {name: (c.stats.env_s / max(1, c.stats.env_steps), c.stats.generate_s / max(1, c.stats.env_steps))
             for name, c in configs.items()}
    for collector in configs.values():
        collector.close()
    local_env.close()
    engines.close()
    ray.shutdown()

    median = {name: statistics.median(r) for name, r in rates.items()}
    scaling = statistics.median(b / a for a, b in zip(rates["ray x1"], rates["ray x2"]))
    overhead = statistics.median(b / a for a, b in zip(rates["in-process"], rates["ray x1"]))
    print("\n| configuration | episodes/s (median) | env step (s) | generate call (s) |")
    print("|---|---|---|---|")
    for name in configs:
        print(f"| {name} | {median[name]:.2f} | {steps[name][0]:.3f} | {steps[name][1]:.3f} |")
    print(f"\nray x2 / ray x1 = {scaling:.2f} (target >= 1.7)")
    print(f"ray x1 / in-process = {overhead:.2f}")


if __name__ == "__main__":
    main()
