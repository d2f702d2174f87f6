"""The built-in training loop: engine -> collector -> reference KL -> loss -> optimizer -> weight sync.

One step of GRPO::

    trajectories = collector.next_batch()                      # num_tasks groups x group_size episodes
    batch = MCAdvantage(batch of trajectories)                 # A_i = (R_i - mean_g R) / std_g R
    batch.ref_logprobs, kl = ReferenceKL(batch)                # frozen policy at RL start, exact tokens
    loss = GRPOLoss(token_logprobs(policy, batch), batch)      # clipped ratio, + beta * k3 KL
    loss.backward(); clip; AdamW.step(); engine.load_weights   # engine.version += 1

With ``lora_rank`` (:mod:`~gym_llm_adapters.training.lora_run`) the policy is a PEFT model: AdamW steps the adapter
only, the push is the adapter alone (``engine.load_adapter``), and the reference is the policy with the adapter off
(after an SFT warm start: with a frozen copy of the adapter RL started from).

One step of SFT: a minibatch of supervised trajectories (the env's worked solutions, or selected rollouts),
assistant-only NLL (:class:`~gym_llm_adapters.losses.SFTLoss`). ``algorithm="grpo"`` with
``sft_warmup_steps > 0`` runs SFT first, then GRPO, in one run with one step counter.

Evaluation every ``eval_every`` steps (and before the first, at the end of the SFT warm start, and after the
last: so a run shows what the warm start did and what RL added on top), checkpoints every
``save_every`` steps, ``metrics.jsonl`` + ``curves.png`` (+ TensorBoard) as it goes. Ctrl-C finishes the
current step, saves a checkpoint and returns; a second Ctrl-C aborts at once (the last checkpoint stays).
``Trainer(config, resume=True)`` continues from the newest checkpoint: weights, optimizer, scheduler, RNG,
engine version; ``rollouts.jsonl`` and ``metrics.jsonl`` are cut back to what that checkpoint had
written. The envs are re-seeded at the resumed step, so a resumed run is deterministic given its
checkpoint (episodes in flight at the interruption are not continued).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import shutil
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from gym_llm_adapters.models.resolve import resolve_model
from gym_llm_adapters.training import checkpoint as ckpt
from gym_llm_adapters.training import lora_run
from gym_llm_adapters.training.config import TrainConfig
from gym_llm_adapters.training.evaluation import EvalSummary, Evaluator
from gym_llm_adapters.training.memory import backward_token_budget
from gym_llm_adapters.training.metrics import MetricsCallback, MetricsLogger, plot_training_curves
from gym_llm_adapters.training.precision import master_dtype
from gym_llm_adapters.training.setup import build_engine, frozen, load_policy, resolve_device
from gym_llm_adapters.training.sft_data import warm_start_data
from gym_llm_adapters.training.step_time import StepTimes
from gym_llm_adapters.training.steps import StepsMixin

__all__ = ["Trainer", "TrainResult"]

logger = logging.getLogger(__name__)

# curves.png is redrawn after an evaluation at most this often (and always at the end of a run): a redraw costs
# ~0.7 s of CPU, a tenth of a 2-minute run that evaluates every 25 steps, nothing in an hour-long one.
PLOT_INTERVAL_S = 30.0


@dataclass
class TrainResult:
    """What :meth:`Trainer.run` did.

    Attributes:
        steps: global steps done at the end (counting earlier runs of a resumed run).
        interrupted: stopped early by Ctrl-C (a checkpoint was saved).
        checkpoint: the last checkpoint written (a loadable model folder), or None.
        evals: ``(step, summary)`` of every evaluation of this run.
        out_dir: the run folder.
        step_time: mean seconds per GRPO step of this run by phase (:meth:`Trainer.step_time`).
        throughput: mean ``perf/<phase>_tokens_per_s`` and ``perf/<phase>_mfu`` of this run's GRPO steps, and
            ``peak_flops`` (:mod:`gym_llm_adapters.training.throughput`); empty without GRPO steps.
    """

    steps: int
    interrupted: bool
    checkpoint: Path | None
    evals: list[tuple[int, EvalSummary]] = field(default_factory=list)
    out_dir: Path | None = None
    step_time: dict[str, float] = field(default_factory=dict)
    throughput: dict[str, float] = field(default_factory=dict)


def lr_factor(i: int, *, warmup: int, length: int, schedule: str) -> float:
    """The learning-rate multiplier of a phase's step ``i`` (0-based; ``length`` steps in the phase): linear warm-up
    ``(i + 1) / (warmup + 1)`` for ``i < warmup``, then ``1`` (constant), or a decay that reaches 0 after the
    phase's last step: linear ``(length - i) / (length - warmup)``, cosine ``0.5 (1 + cos(pi (i - warmup) /
    (length - warmup)))``.

    >>> [round(lr_factor(i, warmup=2, length=6, schedule="linear"), 3) for i in range(6)]
    [0.333, 0.667, 1.0, 0.75, 0.5, 0.25]
    """
    if i < warmup:
        return (i + 1) / (warmup + 1)
    if schedule == "constant" or length <= warmup:
        return 1.0
    progress = (i - warmup) / (length - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

class Trainer(StepsMixin):
    """Runs a :class:`TrainConfig` (module docstring: the loop).

    Args:
        config: the run's settings.
        resume: continue from the newest checkpoint in ``config.out_dir``. Without it, a folder that
            already holds checkpoints is refused (so a run is never overwritten by accident). Its state files are
            read as data only (:mod:`~gym_llm_adapters.training.checkpoint`).
        callbacks: more metric loggers, each called ``callback(step, metrics)`` for every row.

    Raises:
        FileExistsError: ``config.out_dir`` holds a run and ``resume`` is False.
        CheckpointError: the checkpoint to resume holds more than tensors and plain values (a crafted or foreign
            file: nothing of it was run), or is incomplete; the message says how to start from its weights instead.
    """

    def __init__(self, config: TrainConfig, *, resume: bool = False, callbacks: Iterable[MetricsCallback] = ()):
        import torch

        from gym_llm_adapters.training.distributed import data_parallel_from_env

        self.config = config
        self.out_dir = Path(config.out_dir)
        self.dp = data_parallel_from_env(config)  # None in one process; under torchrun: rank, world, collectives
        self.is_main = self.dp is None or self.dp.is_main  # the one writer (metrics, rollouts, checkpoints, evals)
        self.device = resolve_device(config.device) if self.dp is None else self.dp.device(resolve_device(config.device))
        existing = ckpt.latest_checkpoint(self.out_dir)
        if existing is not None and not resume:
            raise FileExistsError(f"{self.out_dir} already holds a run (checkpoint {existing.name}); pass resume=True "
                                  "(--resume) to continue it, or choose another out_dir (--out).")
        # a resumed run's state files are read first, as data only (a crafted one is refused before a model loads)
        saved = ckpt.read_saved_state(existing) if existing is not None else None
        lora = config.lora
        if saved is not None:  # LoRA settings that do not fit the run are refused before anything loads
            lora_run.check_resume(lora, config.model, saved.trainer.lora, run=self.out_dir)
        if lora is not None:
            lora_run.check_engine(config.engine, lora.rank, config.vllm_kwargs)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.state = saved.trainer if saved is not None else ckpt.TrainState(
            step=0, phase="sft" if config.uses_sft else "grpo", version=0, rollout_records=0, reference=None,
            config=config.to_json())
        self.resumed_from = existing
        self._saved_optimizer = saved.optimizer if saved is not None else None  # applied when its phase starts
        # a fresh run's warm-start data is read (and refused: SFTDataError) before any model or engine loads
        self._sft_ready = warm_start_data(config) if existing is None and self._phase_of(0) == "sft" else None
        torch.manual_seed(config.seed)
        np.random.seed(config.seed % 2**32)
        self._load_policy(existing)
        if self.dp is not None:  # identical replicas whatever each rank loaded (a LoRA adapter's init, say)
            self.dp.broadcast_params(self.policy)
        self._root = None  # under FSDP2: the module whose forward is the policy's log-prob call (training/fsdp.py)
        if self.dp is not None and self.dp.strategy == "fsdp":
            from gym_llm_adapters.training.fsdp import shard_for_run

            self._root = shard_for_run(self.policy, self.dp, sharding=config.sharding, device=self.device)
        if saved is not None:  # after the model is built (a fresh adapter's init draws from torch's RNG)
            ckpt.restore_rng(saved.rng)
        self._start_engine()
        from gym_llm_adapters.training.reporters import make_reporters

        self._reporters = make_reporters(config.report_to, self.out_dir, config.to_json(),
                                         resume=existing is not None) if self.is_main else []
        self.metrics = MetricsLogger(self.out_dir, tensorboard=config.tensorboard or "tensorboard" in config.report_to,
                                     callbacks=[*callbacks, *self._reporters],
                                     resume_step=self.state.step if existing is not None else None) \
            if self.is_main else _NoMetrics()
        self.rollouts_path = self.out_dir / "rollouts.jsonl"
        self._writer = None
        if config.write_rollouts and self.is_main:
            from gym_llm_adapters.rollout_io import RolloutWriter, truncate_rollouts

            truncate_rollouts(self.rollouts_path, self.state.rollout_records) if existing is not None else \
                self.rollouts_path.unlink(missing_ok=True)
            self._writer = RolloutWriter(self.rollouts_path)
        self.evaluator = self._build_evaluator() if self.is_main else None
        self._phase: str | None = None
        self._stale_engine = False
        self._stop = False
        self._evals: list[tuple[int, EvalSummary]] = []
        self._plotted_at = -math.inf
        self._token_budget = backward_token_budget(self.policy.config, self.config.activation_memory_gb)
        self._step_times = StepTimes()  # this run's GRPO steps, by phase
        self._perf = StepTimes()  # and their tokens/s and MFU per phase (summed, then averaged)
        self._peak: float | None = None

    # ------------------------------------------------------------------------------------ setup
    def _load_policy(self, checkpoint: Path | None) -> None:
        """``self.policy`` (the transformers model the loss runs on) and ``self.tokenizer``; with LoRA also
        ``self.peft_model``, the PEFT wrapper of the same modules (adapter checkpoints, the reference scope)."""
        cfg = self.config
        self.peft_model = None
        if cfg.lora is None:
            self.model_dir = checkpoint if checkpoint is not None else Path(resolve_model(cfg.model))
            # fp32 master weights whatever the compute dtype (see training/precision.py); bf16 runs use autocast
            self.policy, self.tokenizer = load_policy(self.model_dir, device=self.device,
                                                      dtype=master_dtype(cfg.dtype))
            return
        # LoRA: the frozen base in the compute dtype (it never steps), the adapter in fp32 (training/lora_run.py). A
        # resume takes the base folder the run recorded (--model of a run folder would now name its newest checkpoint)
        recorded = Path(self.state.lora["base_path"]) if checkpoint is not None and self.state.lora else None
        self.model_dir = recorded if recorded is not None and (recorded / "config.json").is_file() else \
            Path(resolve_model(cfg.model))
        self.peft_model, self.tokenizer = lora_run.load_lora_policy(self.model_dir, cfg.lora, device=self.device,
                                                                    dtype=cfg.dtype, adapter_dir=checkpoint)
        self.policy = self.peft_model.get_base_model()
        self.state.lora = lora_run.lora_record(cfg.lora, base_model=cfg.model, base_path=str(self.model_dir))

    def _start_engine(self) -> None:
        """The engine over the starting weights, at the run's policy version, and the sync that pushes to it."""
        cfg = self.config
        adapter, self._adapter_root = None, None
        if self.peft_model is not None:  # each push's adapter folder goes here (the engine reads it)
            from gym_llm_adapters.lora import memory_dir

            self._adapter_root = Path(tempfile.mkdtemp(prefix="gym_llm_adapters_", dir=memory_dir()))
            run_id = uuid.uuid4().hex[:8]
            if self.resumed_from is not None and self.state.version > 0:  # the engine starts on the saved adapter
                adapter = lora_run.checkpoint_adapter(self.resumed_from, self._adapter_root, version=self.state.version,
                                                      run_id=run_id)
        self._server = None
        if cfg.engine == "vllm-server":  # a `vllm serve` process of its own (what --async-steps overlaps with)
            from gym_llm_adapters.training.setup import start_server_engine

            self._server, self.engine = start_server_engine(
                self.model_dir, device=self.device, dtype=cfg.dtype, seed=cfg.seed, version=self.state.version,
                max_model_len=cfg.max_seq_len, vllm_kwargs=cfg.vllm_kwargs, lora_rank=cfg.lora_rank, adapter=adapter,
                cpus=cfg.engine_cpus or None, log_path=self.out_dir / "engine.log" if self.is_main else None)
        else:
            self.engine = build_engine(cfg.engine, self.model_dir, device=self.device, dtype=cfg.dtype, seed=cfg.seed,
                                       version=self.state.version, max_model_len=cfg.max_seq_len,
                                       vllm_kwargs=cfg.vllm_kwargs, logprobs_mode="processed",
                                       lora_rank=cfg.lora_rank, adapter=adapter)
        if self.peft_model is None:
            from gym_llm_adapters.weights import WeightSync

            self.sync = WeightSync(self.policy, self.engine)
        else:
            from gym_llm_adapters.lora import AdapterSync

            self.sync = AdapterSync(self.peft_model, self.engine, root=self._adapter_root, run_id=run_id)

    def _build_evaluator(self) -> Evaluator:
        from gym_llm_adapters.engines import SamplingConfig

        cfg = self.config
        sampling = SamplingConfig(max_tokens=cfg.max_new_tokens, temperature=cfg.eval_temperature, top_p=cfg.top_p)
        env_id, kwargs = (cfg.env_id, {**cfg.env_kwargs, **cfg.eval_env_kwargs}) if cfg.eval_env_id is None else \
            (cfg.eval_env_id, dict(cfg.eval_env_kwargs))
        return Evaluator(env_id, kwargs, self.engine,
                         episodes=cfg.eval_episodes, sampling=sampling, seed=cfg.seed + 10_007,
                         max_seq_len=cfg.max_seq_len, max_new_tokens=cfg.max_new_tokens)

    def _start_phase(self, phase: str) -> None:
        """Fresh optimizer + warm-up schedule, and the phase's data (SFT examples, or envs + collector)."""
        import torch

        cfg = self.config
        lr = cfg.sft_learning_rate if phase == "sft" and cfg.sft_learning_rate is not None else cfg.learning_rate
        params = [p for p in self.policy.parameters() if p.requires_grad]  # all, or a LoRA adapter's
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
        length = cfg.sft_warmup_steps if phase == "sft" and cfg.algorithm == "grpo" else cfg.steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, functools.partial(lr_factor, warmup=max(cfg.lr_warmup_steps, 0), length=length,
                                              schedule=cfg.lr_schedule))
        if self._saved_optimizer is not None:
            saved, self._saved_optimizer = self._saved_optimizer, None
            if self.state.step > 0 and self._phase_of(self.state.step - 1) == phase:  # saved mid-phase: go on
                if self._root is not None:  # whole moments in the file (any run's): cut to this rank's shards
                    from gym_llm_adapters.training.fsdp import load_optimizer_state

                    load_optimizer_state(self.optimizer, saved["optimizer"])
                else:
                    self.optimizer.load_state_dict(saved["optimizer"])
                self.scheduler.load_state_dict(saved["scheduler"])
        self._phase_start = self.state.step
        if phase == "sft":
            from gym_llm_adapters.losses import SFTLoss

            self._sft_examples, self._sft_ready = self._sft_ready or warm_start_data(cfg, self.tokenizer), None
            self._sft_loss = SFTLoss()
        else:
            self._start_rl()
        self._phase = phase

    def _start_rl(self) -> None:
        import gymnasium as gym

        from gym_llm_adapters.collector import Collector
        from gym_llm_adapters.engines import SamplingConfig
        from gym_llm_adapters.kl import ReferenceKL, ReferenceKLConfig
        from gym_llm_adapters.losses import AdvantageConfig, GRPOLoss, GRPOLossConfig, MCAdvantage

        cfg = self.config
        self._push_if_stale()
        if self._peak is None:  # the machine's own matmul peak in the run's dtype, for MFU (a fraction of a second)
            from gym_llm_adapters.training.throughput import matmul_params, matmul_peak

            self._peak = matmul_peak(self.device, cfg.dtype)
            self._matmul_params = matmul_params(self.policy)
            logger.info("measured matmul peak: %.0f GFLOP/s (%s, %s); the model multiplies %.1f M parameters per token",
                        self._peak / 1e9, self.device, cfg.dtype, self._matmul_params / 1e6)
        if cfg.beta > 0 or cfg.log_kl:  # scored under the same sampling distribution as the policy
            model, scope = (self._reference_model(), None) if self.peft_model is None else \
                (self.policy, self._lora_reference_scope())
            self.reference = ReferenceKL(model, ReferenceKLConfig(
                temperature=cfg.temperature, top_p=cfg.top_p, share_prefix=cfg.share_prefix), scope=scope)
        else:
            self.reference = None
        kwargs = {"task_assignment": "partition", **cfg.env_kwargs}
        tasks, rank = self._tasks_per_rank(), (self.dp.rank if self.dp is not None else 0)
        self.envs = gym.make_vec(cfg.env_id, num_envs=tasks * cfg.group_size, group_size=cfg.group_size,
                                 vectorization_mode="vector_entry_point", mode="tokens", tokenizer=self.tokenizer,
                                 max_seq_len=cfg.max_seq_len, max_action_tokens=cfg.max_new_tokens, **kwargs)
        sampling = SamplingConfig(max_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
        # Re-seeded per resumed step: a resumed run does not replay the interrupted one's env state.
        stages = [cfg.judge.stage()] if cfg.judge is not None else []
        self.collector = Collector(self.envs, self.engine, sampling, episodes_per_batch=tasks * cfg.group_size,
                                   seed=cfg.seed + 1_000_003 * self.state.step + (rank << 40), branch_turn=cfg.branch_turn,
                                   reward_stages=stages, env_reward_weight=cfg.judge.env_weight if stages else 1.0)
        self._overlap = None
        if cfg.async_steps:  # the collector on a thread, up to k batches ahead of the trainer (training/overlap.py)
            from gym_llm_adapters.training.overlap import OverlappedRollouts

            self._overlap = OverlappedRollouts(self.collector, self.engine, k=cfg.async_steps)
        self.advantage = MCAdvantage(AdvantageConfig(scale=cfg.advantage_scale, group_size=cfg.group_size))
        self.loss_fn = GRPOLoss(GRPOLossConfig(
            beta=cfg.beta, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high, aggregation=cfg.aggregation,
            max_completion_length=self._episode_token_budget() if cfg.aggregation == "dr_grpo" else None,
            importance_sampling=cfg.importance_sampling, stale_tokens=cfg.stale_tokens,
            mask_truncated=cfg.mask_truncated_completions))

    def _episode_token_budget(self) -> int:
        """The most policy tokens one episode can hold: every turn's ``max_new_tokens``, within ``max_seq_len``
        (the Dr. GRPO constant is per row, and a row is a whole episode)."""
        chat = getattr(getattr(self.envs, "parts", None), "extra", {}).get("chat")  # chat-style envs' ChatCommon
        turns = int(getattr(getattr(chat, "config", None), "max_turns", 1) or 1)
        return min(turns * self.config.max_new_tokens, self.config.max_seq_len)

    def _reference_model(self) -> Any:
        """The frozen policy at the start of RL: saved once when RL follows an SFT warm-up (for resumes)."""
        if self.state.reference is not None:
            return load_policy(self.state.reference, device=self.device, dtype=self.config.dtype)[0].eval()
        if self.config.sft_warmup_steps and self.state.step > 0:  # RL starts now, after SFT: keep this policy
            path = ckpt.checkpoints_dir(self.out_dir) / "reference"
            whole = self._full_weights()  # under FSDP2 every rank gathers; rank 0 writes
            if self.is_main:
                self.policy.save_pretrained(path, state_dict=whole, safe_serialization=True)
                self.tokenizer.save_pretrained(path)
            if self.dp is not None:  # every rank reads it next
                self.dp.barrier()
            self.state.reference = str(path)
            if self._root is not None:  # a sharded policy is not copied: its whole weights, just written
                return frozen(load_policy(path, device=self.device, dtype=master_dtype(self.config.dtype))[0])
        elif self.resumed_from is not None:  # the reference is the starting model
            return load_policy(resolve_model(self.config.model), device=self.device, dtype=self.config.dtype)[0].eval()
        elif self._root is not None:  # the sharded policy's starting weights, whole: those every rank loaded
            return frozen(load_policy(self.model_dir, device=self.device, dtype=master_dtype(self.config.dtype))[0])
        return frozen(copy.deepcopy(self.policy))

    def _lora_reference_scope(self) -> Any:
        """LoRA's reference: the base with the adapter off; after an SFT warm start, with the adapter as RL found it
        (saved once, for resumes; training/lora_run.py says why not a merge)."""
        if self.state.reference is None and self.config.sft_warmup_steps and self.state.step > 0:
            path = ckpt.checkpoints_dir(self.out_dir) / "reference"
            if self.is_main:
                lora_run.save_reference_adapter(self.peft_model, path)
            if self.dp is not None:  # every rank reads it next
                self.dp.barrier()
            self.state.reference = str(path)
        return lora_run.reference_scope(self.peft_model, self.state.reference, device=self.device)

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def _push_if_stale(self) -> None:
        if self._stale_engine:
            self.sync.push() if getattr(self, "_overlap", None) is None else self._overlap.push(self.sync)
            self._stale_engine = False

    # ------------------------------------------------------------------------------------ eval & save
    def evaluate(self) -> EvalSummary:
        """Evaluate the current policy (pushes pending weights to the engine first) and log ``eval/*``. Under data
        parallelism rank 0 evaluates on its engine and the others return None at once."""
        self._push_if_stale()
        if not self.is_main:
            return None
        writer = contextlib.nullcontext()
        if self.config.write_rollouts:  # the held-out episodes of this evaluation (`gym-llm view` shows them)
            from gym_llm_adapters.rollout_io import RolloutWriter

            path = self.out_dir / "eval" / f"step-{self.state.step:06d}.jsonl"
            path.unlink(missing_ok=True)  # a resumed run's evaluation at the same step replaces the earlier one
            writer = RolloutWriter(path)
        paused = self._overlap.paused() if getattr(self, "_overlap", None) is not None else contextlib.nullcontext()
        with writer as open_writer, paused:  # closed (and fsynced) even when the evaluation raises
            _, summary = self.evaluator.run(pass_threshold=self.config.pass_threshold, writer=open_writer)
        self.metrics.log(self.state.step, summary.metrics())
        self._evals.append((self.state.step, summary))
        if time.monotonic() - self._plotted_at >= PLOT_INTERVAL_S:
            self._plot()
        return summary

    def _plot(self) -> None:
        """Redraw ``curves.png`` (after an evaluation at most every :data:`PLOT_INTERVAL_S`, and at the end)."""
        if not self.is_main:
            return
        self._plotted_at = time.monotonic()
        try:
            plot_training_curves(self.metrics.rows, self.out_dir / "curves.png",
                                 title=f"{self.config.algorithm} on {self.config.env_id} ({self.config.model})",
                                 phase_boundary=self.config.sft_warmup_steps or None)
        except ImportError as e:  # matplotlib missing: metrics.jsonl still has everything
            logger.warning("no plot: %s", e)

    def save(self) -> Path:
        """Checkpoint now (the model folder is loadable by transformers and vLLM). Under data parallelism rank 0
        writes it (the replicas are equal) and every rank waits for it, so a resume finds it whole."""
        self._push_if_stale()  # the saved version then names exactly the saved weights
        self.state.version = self.engine.version
        self.state.phase = self._phase_of(self.state.step)
        model = self.policy if self.peft_model is None else self.peft_model  # a LoRA run saves its adapter
        whole = None
        if self._root is not None:  # FSDP2: every rank gathers the whole weights and moments; rank 0 writes them
            from gym_llm_adapters.training.fsdp import full_optimizer_state

            whole = (self._full_weights(), full_optimizer_state(self.optimizer))
        if not self.is_main:
            self.dp.barrier()
            return ckpt.checkpoints_dir(self.out_dir) / f"step-{self.state.step:06d}"
        if self.dp is not None:
            try:
                return self._save(model, whole)
            finally:
                self.dp.barrier()
        return self._save(model, whole)

    def _save(self, model: Any, whole: tuple[dict, dict] | None = None) -> Path:
        return ckpt.save_checkpoint(self.out_dir, self.state, model=model, tokenizer=self.tokenizer,
                                    optimizer=self.optimizer, scheduler=self.scheduler,
                                    keep=self.config.keep_checkpoints, model_state=whole and whole[0],
                                    optimizer_state=whole and whole[1])

    def _full_weights(self) -> dict[str, Any] | None:
        """The policy's whole weights under FSDP2 (collective: every rank calls it); None otherwise (the model's own
        state dict is whole)."""
        if self._root is None:
            return None
        from gym_llm_adapters.training.fsdp import full_state_dict

        return full_state_dict(self.policy)

    def _phase_of(self, step: int) -> str:
        if self.config.algorithm == "sft" or step < self.config.sft_warmup_steps:
            return "sft"
        return "grpo"

    # ------------------------------------------------------------------------------------ the loop
    def run(self) -> TrainResult:
        """Train until ``config.total_steps`` (or Ctrl-C); returns a :class:`TrainResult`."""
        cfg = self.config
        last_checkpoint: Path | None = None
        previous = self._install_sigint()
        bar = _progress(cfg.total_steps, self.state.step, cfg.progress and self.is_main)
        try:
            if self.resumed_from is None:
                self.evaluate()
            while self.state.step < cfg.total_steps and not self._stop:
                phase = self._phase_of(self.state.step)
                if phase != self._phase:
                    self._start_phase(phase)
                start = time.perf_counter()
                metrics = self._sft_step() if phase == "sft" else self._grpo_step()
                self.state.step += 1
                metrics[f"{'sft' if phase == 'sft' else 'train'}/step_s"] = time.perf_counter() - start
                if self.dp is not None:  # a Ctrl-C seen by any rank stops every rank after this same step
                    self._stop = self.dp.any(self._stop)
                self.metrics.log(self.state.step, metrics)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(_postfix(metrics))
                done = self.state.step >= cfg.total_steps
                warm_started = cfg.algorithm == "grpo" and self.state.step == cfg.sft_warmup_steps
                if done or warm_started or (cfg.eval_every and self.state.step % cfg.eval_every == 0):
                    self.evaluate()
                if done or self._stop or self.state.step % cfg.save_every == 0:
                    last_checkpoint = self.save()
            saved_now = last_checkpoint is not None and last_checkpoint.name == f"step-{self.state.step:06d}"
            if self._stop and self._phase is not None and not saved_now:
                last_checkpoint = self.save()
        finally:
            if bar is not None:
                bar.close()
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            self._plot()
        if self._stop:
            logger.warning("stopped (Ctrl-C or request_stop) after step %d; resume with --resume (checkpoint %s)",
                           self.state.step, last_checkpoint)
        return TrainResult(steps=self.state.step, interrupted=self._stop, checkpoint=last_checkpoint,
                           evals=list(self._evals), out_dir=self.out_dir, step_time=self.step_time(),
                           throughput={**self._perf.means(), "peak_flops": self._peak} if self._perf.steps else {})

    def request_stop(self) -> None:
        """Stop after the current step (what the first Ctrl-C does)."""
        self._stop = True

    def _install_sigint(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum: int, frame: Any) -> None:
            if self._stop:
                raise KeyboardInterrupt  # the second Ctrl-C: abort now, the last checkpoint stays
            logger.warning("Ctrl-C: finishing step %d, then saving a checkpoint (Ctrl-C again to abort now)",
                           self.state.step + 1)
            self._stop = True

        return signal.signal(signal.SIGINT, handler)

    def close(self) -> None:
        """Release envs, engine and files."""
        if getattr(self, "_overlap", None) is not None:  # the rollout thread first: it uses the collector
            self._overlap.close()
        for name in ("collector", "envs"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
        if self.evaluator is not None:
            self.evaluator.close()
        if self._writer is not None:
            self._writer.close()
        self.metrics.close()
        for reporter in getattr(self, "_reporters", ()):
            reporter.close()
        self.engine.close()
        if self._server is not None:
            self._server.stop()
        if self._adapter_root is not None:  # a LoRA run's pushed adapter folders
            shutil.rmtree(self._adapter_root, ignore_errors=True)
        if self.dp is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _NoMetrics:
    """The metrics of a data-parallel rank other than 0: rank 0 writes the run's (global) metrics."""

    rows: list[dict[str, Any]] = []

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)


def _postfix(metrics: dict[str, float]) -> dict[str, str]:
    keys = ("train/reward_mean", "train/kl", "train/loss", "sft/loss")
    return {k.split("/")[1]: f"{metrics[k]:.3g}" for k in keys if k in metrics}
