"""``gym-llm train grpo|sft --env ENV --model M``: the built-in training loop.

GRPO: each step samples ``--num-tasks`` groups of ``--group-size`` episodes with the engine, computes
group-normalised advantages, the KL to a frozen reference and the clipped GRPO loss, takes an optimizer
step and pushes the new weights to the engine. ``--sft-warmup-steps N`` first runs N SFT steps on the
env's worked solutions (a warm start), in the same run. SFT: supervised steps on the env's worked
solutions (``--sft-data references``) or on a rollout file (e.g. from ``gym-llm eval --out``), filtered
with ``--sft-min-reward`` / ``--sft-top-k``.

``--lora-rank R`` trains a LoRA adapter instead of every weight (the engine is sent the adapter alone; the KL
reference is the model with the adapter off; ``gym-llm export OUT --merge`` makes a plain model of it).

Evaluates every ``--eval-every`` steps (and before the first and after the last), checkpoints every
``--save-every`` steps into OUT/checkpoints (normal model folders), and writes OUT/metrics.jsonl,
OUT/rollouts.jsonl and OUT/curves.png (reward, KL and loss curves). Ctrl-C finishes the current step
and saves a checkpoint; ``--resume`` continues from it.

The CPU demo (the README's main job: a tiny model, SFT warm start then GRPO on generated addition):

    gym-llm train grpo --config examples/configs/arithmetic_tiny.toml --out runs/arithmetic
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from gym_llm_adapters.cli._common import (
    _env_arg,
    add_env_options,
    add_model_options,
    check_env,
    check_model,
    check_paths,
    dtype_for,
    engine_kind,
    env_kwargs_from,
    dropout,
    fit_seq_len,
    lora_rank,
    non_negative_float,
    positive_float,
    positive_int,
    probability,
    probe_env,
)

from gym_llm_adapters.cli.errors import UsageError

__all__ = ["register", "run", "config_from_args"]

logger = logging.getLogger(__name__)


def _target_modules(value: str | list[str] | None) -> str | tuple[str, ...]:
    """``--lora-target-modules`` (or a config's ``lora_target_modules``, a string or a list) as TrainConfig takes it."""
    if value is None:
        return "all-linear"
    names = [value] if isinstance(value, str) else [str(v) for v in value]
    return "all-linear" if names == ["all-linear"] else tuple(names)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="train a model on an env (GRPO, or SFT)", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algorithm", choices=("grpo", "sft"), help="grpo (RL on the env reward) or sft")
    parser.add_argument("--config", metavar="TOML",
                        help="read option defaults from a TOML file (keys are the flags' names; tables [env_args], "
                             "[eval_env_args], [vllm_args]); flags on the command line override it. "
                             "Example: examples/configs/arithmetic_tiny.toml")
    parser.add_argument("--trust-file", action="store_true",
                        help="trust the --config file: pass its [env_args], [eval_env_args] and [vllm_args] on as "
                             "they are. Default: values that would run code or weaken isolation (a reward function, "
                             "sandbox or network settings, trust_remote_code, ...) are refused, each named "
                             "(docs/cli.md, 'Files from elsewhere')")
    add_env_options(parser, positional=False)
    parser.add_argument("--eval-env-arg", dest="eval_env_args", action="append", default=[], metavar="KEY=VALUE",
                        type=_env_arg,
                        help="override an env argument for evaluation only (e.g. a test file: "
                             "--eval-env-arg data_files=test.jsonl)")
    add_model_options(parser)
    engine = next(a for a in parser._actions if a.dest == "engine")  # training also runs vLLM as a server
    engine.choices = (*engine.choices, "vllm-server")
    engine.help = ("generation backend: in-process vLLM, transformers, or vllm-server (a `vllm serve` process the run "
                   "starts: what --async-steps overlaps with); auto = in-process vLLM when installed (default: auto)")
    run_group = parser.add_argument_group("run")
    run_group.add_argument("--out", type=Path, default=Path("runs/train"), help="the run folder (default: runs/train)")
    run_group.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    run_group.add_argument("--seed", type=int, default=0, help="seeds torch, envs and sampling (default: 0)")
    run_group.add_argument("--steps", type=positive_int, default=100, help="optimizer steps of the algorithm (default: 100)")
    run_group.add_argument("--learning-rate", "--lr", type=non_negative_float, default=1e-5,
                           help="AdamW lr (default: 1e-5)")
    run_group.add_argument("--lr-warmup-steps", type=int, default=0,
                           help="linear lr warm-up at the start of each phase (default: 0)")
    run_group.add_argument("--lr-schedule", choices=("constant", "linear", "cosine"), default="constant",
                           help="after the warm-up: constant, or a linear/cosine decay to 0 at the end of each "
                                "phase (default: constant)")
    run_group.add_argument("--weight-decay", type=float, default=0.0)
    run_group.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping; 0 = off (default: 1)")
    run_group.add_argument("--micro-batch-size", type=int, default=None,
                           help="sequences per forward/backward (gradient accumulation); default: the whole batch")
    run_group.add_argument("--activation-memory-gb", type=float, default=4.0,
                           help="cut batches into micro-batches so a backward keeps about this much activation memory "
                                "(tokens per micro-batch from the model's layers and widths); 0 = no cap (default: 4)")
    grpo = parser.add_argument_group("GRPO")
    grpo.add_argument("--num-tasks", type=positive_int, default=8, help="groups (tasks) per step (default: 8)")
    grpo.add_argument("--group-size", type=positive_int, default=8, help="samples per task (default: 8)")
    grpo.add_argument("--branch-turn", type=positive_int, default=None,
                      help="tree groups: a group's samples share its first sample's first N turns and differ after "
                           "(multi-turn envs; docs/branching.md). Default: flat groups")
    grpo.add_argument("--max-new-tokens", type=positive_int, default=256, help="tokens per assistant turn (default: 256)")
    grpo.add_argument("--max-seq-len", type=positive_int, default=None,
                      help="longest episode in tokens (default: 2048, or less if the model takes less)")
    grpo.add_argument("--temperature", type=non_negative_float, default=1.0, help="sampling temperature (default: 1.0)")
    grpo.add_argument("--top-p", type=probability, default=1.0,
                      help="nucleus sampling mass (default: 1.0 = off); the trainer's and reference's log-probs are "
                           "those of the distribution sampled at this temperature and top-p")
    grpo.add_argument("--beta", type=non_negative_float, default=0.0, help="KL-to-reference weight in the loss (default: 0)")
    grpo.add_argument("--epsilon", type=float, default=0.2, help="clip range (default: 0.2)")
    grpo.add_argument("--epsilon-high", type=float, default=None, help="upper clip range (DAPO: 0.28)")
    grpo.add_argument("--aggregation", choices=("token_mean", "sequence_mean", "dr_grpo"), default="token_mean")
    grpo.add_argument("--advantage-scale", choices=("group", "batch", "none"), default="group",
                      help="divide advantages by the group's reward std (GRPO), the batch's, or not (Dr. GRPO)")
    grpo.add_argument("--importance-sampling", default="token_truncate",
                      choices=("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
                      help="engine/trainer log-prob mismatch correction (default: token_truncate)")
    grpo.add_argument("--stale-tokens", choices=("behaviour_ratio", "mask", "ignore"), default="behaviour_ratio",
                      help="turns sampled before a weight update (multi-turn episodes): ratio against the version "
                           "that sampled them (default), leave them out, or treat as on-policy")
    grpo.add_argument("--mask-truncated-completions", action="store_true",
                      help="leave episodes cut by the length or turn limit out of the loss")
    grpo.add_argument("--num-iterations", type=positive_int, default=1, metavar="MU",
                      help="optimizer passes over each batch (GRPO's mu, TRL's num_iterations); later passes' ratio is "
                           "against the log-probs taken before the first (default: 1)")
    grpo.add_argument("--async-steps", type=int, default=0, metavar="K",
                      help="generate the next K steps' batches while a step trains (needs --engine vllm-server); no "
                           "trained token is more than K versions old (default: 0, generate then train)")
    grpo.add_argument("--engine-cpus", type=_cpu_list, default=(), metavar="LIST",
                      help="with --engine vllm-server: the CPU cores the server runs on, e.g. 0 or 0-3,6 (run the "
                           "trainer itself under taskset on the others)")
    grpo.add_argument("--sharding", choices=("auto", "ddp", "fsdp"), default="auto",
                      help="under torchrun: fsdp (FSDP2: each rank holds 1/N of the weights, gradients and optimizer "
                           "state), ddp (whole replicas, gradients all-reduced), auto (fsdp for a full fine-tune, ddp "
                           "with --lora-rank; default)")
    grpo.add_argument("--no-kl-log", action="store_true", help="do not measure the KL when --beta is 0")
    grpo.add_argument("--sft-warmup-steps", type=int, default=0, help="SFT steps before RL starts (default: 0)")
    lora = parser.add_argument_group(
        "LoRA (train a low-rank adapter on the frozen model instead of every weight; docs/cli.md, 'LoRA')")
    lora.add_argument("--lora-rank", type=lora_rank, default=None, metavar="R",
                      help="train a LoRA adapter of rank R (PEFT): only the adapter trains and is pushed to the "
                           "engine; the KL reference is the model with the adapter off; checkpoints hold the adapter "
                           "(gym-llm export RUN --merge makes a plain model). Default: train every weight")
    lora.add_argument("--lora-alpha", type=positive_float, default=None, metavar="A",
                      help="scale the update by A / R (default: 2 R)")
    lora.add_argument("--lora-dropout", type=dropout, default=0.0, metavar="P",
                      help="dropout on the adapter's input in training, in [0, 1) (default: 0)")
    lora.add_argument("--lora-target-modules", nargs="+", default=None, metavar="NAME",
                      help="the linear layers to adapt, by name (e.g. q_proj v_proj), or all-linear (default: every "
                           "linear layer but the output head)")
    judge = parser.add_argument_group("judge (an LLM judge's score as the reward, or beside the env's; docs/judges.md)")
    judge.add_argument("--judge-url", default=None, metavar="URL",
                       help="an OpenAI-compatible endpoint serving the judge (e.g. http://127.0.0.1:8000/v1 from "
                            "`vllm serve`); probed before anything loads")
    judge.add_argument("--judge-model", default=None, metavar="NAME", help="the model the endpoint serves")
    judge.add_argument("--judge-mode", choices=("reply", "group"), default="reply",
                       help="judge each reply alone, or each GRPO group's replies together in one call (default: reply)")
    judge.add_argument("--judge-criterion", default=None, metavar="TEXT",
                       help="what the judge checks (default: each task's 'criterion' field)")
    judge.add_argument("--judge-weight", type=float, default=1.0, help="the judge's weight in the reward (default: 1)")
    judge.add_argument("--env-reward-weight", type=float, default=1.0,
                       help="the env's own reward's weight beside the judge's (default: 1; 0 = the judge alone)")
    judge.add_argument("--judge-structured", action="store_true",
                       help="constrain the judge's output to the score format (vLLM servers)")
    judge.add_argument("--judge-key-env", default=None, metavar="VAR", help="the variable holding a provider's key")
    judge.add_argument("--judge-deadline", type=positive_float, default=60.0, help="seconds per judgement (default: 60)")
    judge.add_argument("--judge-range", default="0-10", metavar="LOW-HIGH",
                       help="the integer score range the judge answers in (default: 0-10)")
    judge.add_argument("--judge-score", choices=("sampled", "expected"), default="sampled",
                       help="the integer the judge wrote, or its probability-weighted score (needs a range in 0-9, "
                            "per-reply mode)")
    judge.add_argument("--judge-defences", choices=("default", "all", "none"), default="default",
                       help="default: the reply delimited, the judge's last line only; all: also refuse replies that "
                            "contain a score line")
    parser.add_argument("--eval-env", default=None, metavar="ID",
                        help="evaluate on another env id (with --eval-env-arg alone as its arguments), e.g. a "
                             "rule-checked env beside a judged one")
    sft = parser.add_argument_group("SFT (plain, or the GRPO warm-up)")
    sft.add_argument("--sft-data", default="references",
                     help="'references' (the env tasks' worked solutions) or a rollout file (default: references)")
    sft.add_argument("--sft-learning-rate", type=float, default=None, help="the SFT phase's lr (default: --lr)")
    sft.add_argument("--sft-batch-size", type=positive_int, default=32, help="sequences per SFT step (default: 32)")
    sft.add_argument("--sft-examples", type=int, default=None, help="use at most this many reference tasks")
    sft.add_argument("--sft-min-reward", type=float, default=None, help="keep rollouts with reward >= this")
    sft.add_argument("--sft-top-k", type=int, default=None, help="keep the best k rollouts of each group")
    ev = parser.add_argument_group("evaluation, checkpoints, logging")
    ev.add_argument("--eval-every", type=int, default=10, help="steps between evaluations; 0 = first and last only")
    ev.add_argument("--eval-episodes", type=int, default=64, help="episodes per evaluation (default: 64)")
    ev.add_argument("--eval-temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    ev.add_argument("--pass-threshold", type=float, default=1.0, help="reward that counts as a pass (default: 1)")
    ev.add_argument("--save-every", type=int, default=50, help="steps between checkpoints (default: 50)")
    ev.add_argument("--keep-checkpoints", type=int, default=2, help="recent checkpoints kept (default: 2)")
    ev.add_argument("--no-rollouts", action="store_true", help="do not write OUT/rollouts.jsonl")
    ev.add_argument("--tensorboard", action="store_true", help="also write TensorBoard logs to OUT/tensorboard")
    ev.add_argument("--report-to", nargs="+", default=[], metavar="NAME", choices=["tensorboard", "trackio", "wandb"],
                    help="also send the metrics to these (TRL's names): tensorboard, trackio, wandb "
                         "(wandb without network: WANDB_MODE=offline)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def _check_out(out: Path, resume: bool) -> None:
    """A run never mixes with another: an existing run in ``--out`` needs ``--resume``; ``--resume`` needs a run."""
    from gym_llm_adapters.training.checkpoint import latest_checkpoint

    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give the run's folder (e.g. runs/my-run)")
    has_run = out.is_dir() and latest_checkpoint(out) is not None
    if resume and not has_run:
        raise UsageError(f"--resume: {out} holds no run to continue (no checkpoint); drop --resume to start one")
    if not resume and has_run:
        raise UsageError(f"--out {out} already holds a run; pass --resume to continue it, or choose another --out")
    if not resume and out.is_dir() and any(p.name != "train.log" for p in out.iterdir()):  # the log: a failed start
        raise UsageError(f"--out {out} is a folder with other files in it; choose a new or empty folder")


def _check_config_file(args: argparse.Namespace) -> None:
    """A ``--config`` file's env and vLLM arguments go through the allow-list of :mod:`gym_llm_adapters.trust`
    (a config is a file someone may send you), unless ``--trust-file``; the ones given on the command line too are the
    user's own."""
    from_config = getattr(args, "from_config", None) or {}
    if args.trust_file or not from_config:
        return
    from dataclasses import replace

    from gym_llm_adapters.trust import Refusal, check_env_arguments, check_vllm_arguments, refuse

    typed = args.typed
    refusals = []
    for dest in ("env_args", "eval_env_args", "vllm_args"):
        mine = {key for key, _ in getattr(typed, dest)}
        theirs = {key: value for key, value in from_config.get(dest, []) if key not in mine}
        env_id = args.eval_env if dest == "eval_env_args" and args.eval_env else args.env
        found = check_vllm_arguments(theirs) if dest == "vllm_args" else check_env_arguments(env_id, theirs)
        refusals += [replace(r, argument=f"[{dest}] {r.argument}") for r in found]
    if from_config.get("judge_key_env") is not None and typed.judge_key_env is None:
        # the judge sends that variable's value to judge_url: a file naming both could send any secret anywhere
        refusals.append(Refusal("judge_key_env", from_config["judge_key_env"],
                                "a file may not name an environment variable whose value is sent to its judge_url"))
    try:
        refuse(refusals, source=f"--config {args.config}",
               opt_in="if you trust this config as you would its author's code, pass --trust-file; or give your own "
                      "value on the command line (--env-arg, --eval-env-arg, --vllm-arg KEY=VALUE)")
    except ValueError as e:
        raise UsageError(str(e)) from e


def _check_lora(config, resume: bool) -> None:
    """LoRA settings that cannot work are refused before any model loads: ones that do not fit the run being resumed
    (or a LoRA run resumed without them), an engine that cannot serve adapters, target modules the model lacks, a rank
    above a targeted layer's width."""
    from gym_llm_adapters.training import lora_run
    from gym_llm_adapters.training.checkpoint import CheckpointError, latest_checkpoint, load_trainer_state

    try:
        if resume:
            state = load_trainer_state(latest_checkpoint(config.out_dir))
            lora_run.check_resume(config.lora, config.model, state.lora, run=config.out_dir)
        if config.lora is not None:
            lora_run.check_engine(config.engine, config.lora_rank, config.vllm_kwargs)
            lora_run.check_model(config.lora, config.model)
    except (CheckpointError, ValueError) as e:
        raise UsageError(str(e)) from e


def _check_judge(config, env_id: str) -> None:
    """The judge answers (one probe of its endpoint) and its rubric can be filled from the env's tasks."""
    import gymnasium as gym

    from gym_llm_adapters.reward_stages import check_stage_tasks

    try:
        stage = config.judge.stage()
        env = gym.make(env_id, **config.env_kwargs)
        try:
            check_stage_tasks(stage, env.unwrapped.parts.tasks, env_id)
        finally:
            env.close()
    except (ValueError, ConnectionError, ImportError) as e:
        raise UsageError(str(e)) from e


def judge_settings(args: argparse.Namespace):
    """The ``--judge-*`` flags as :class:`~gym_llm_adapters.reward_stages.JudgeSettings`, or None without a judge."""
    if args.judge_url is None and args.judge_model is None:
        return None
    if args.judge_url is None or args.judge_model is None:
        raise UsageError("a judge needs both --judge-url (the endpoint) and --judge-model (the model it serves)")
    from gym_llm_adapters.reward_stages import JudgeSettings

    try:
        low, high = (int(x) for x in str(args.judge_range).split("-"))
    except ValueError:
        raise UsageError(f"--judge-range {args.judge_range!r}: expected two whole numbers LOW-HIGH, e.g. 0-10 or "
                         "0-1") from None
    return JudgeSettings(url=args.judge_url, model=args.judge_model, mode=args.judge_mode, low=low, high=high,
                         score=args.judge_score,
                         criterion=args.judge_criterion, weight=args.judge_weight, env_weight=args.env_reward_weight,
                         structured=args.judge_structured, api_key_env=args.judge_key_env,
                         deadline_s=args.judge_deadline, defences=args.judge_defences)


def config_from_args(args: argparse.Namespace):
    """The :class:`~gym_llm_adapters.training.TrainConfig` the flags describe."""
    from gym_llm_adapters.training import TrainConfig
    from gym_llm_adapters.training.setup import resolve_device

    device = resolve_device(args.device)
    return TrainConfig(
        algorithm=args.algorithm, env_id=args.env, env_kwargs=env_kwargs_from(args),
        eval_env_kwargs=dict(args.eval_env_args), eval_env_id=args.eval_env, judge=judge_settings(args),
        model=args.model, out_dir=args.out, seed=args.seed,
        engine=engine_kind(args), device=device, dtype=dtype_for(args, device), vllm_kwargs=dict(args.vllm_args),
        steps=args.steps, sft_warmup_steps=args.sft_warmup_steps, learning_rate=args.learning_rate,
        sft_learning_rate=args.sft_learning_rate, lr_warmup_steps=args.lr_warmup_steps,
        lr_schedule=args.lr_schedule,
        weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm or None, num_tasks=args.num_tasks,
        group_size=args.group_size, branch_turn=args.branch_turn, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p, max_seq_len=args.max_seq_len or 2048, beta=args.beta, epsilon=args.epsilon,
        epsilon_high=args.epsilon_high, aggregation=args.aggregation, advantage_scale=args.advantage_scale,
        importance_sampling=args.importance_sampling, log_kl=not args.no_kl_log, stale_tokens=args.stale_tokens,
        mask_truncated_completions=args.mask_truncated_completions, num_iterations=args.num_iterations,
        async_steps=args.async_steps, engine_cpus=tuple(args.engine_cpus), sharding=args.sharding,
        micro_batch_size=args.micro_batch_size, activation_memory_gb=args.activation_memory_gb or None,
        lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
        lora_target_modules=_target_modules(args.lora_target_modules), sft_data=args.sft_data,
        sft_batch_size=args.sft_batch_size,
        sft_examples=args.sft_examples, sft_min_reward=args.sft_min_reward, sft_top_k=args.sft_top_k,
        eval_every=args.eval_every, eval_episodes=args.eval_episodes, eval_temperature=args.eval_temperature,
        pass_threshold=args.pass_threshold, save_every=args.save_every, keep_checkpoints=args.keep_checkpoints,
        write_rollouts=not args.no_rollouts, tensorboard=args.tensorboard, report_to=tuple(args.report_to),
        progress=not args.no_progress)


def _cpu_list(text: str) -> tuple[int, ...]:
    """``"0-3,6"`` -> ``(0, 1, 2, 3, 6)``."""
    cores: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cores += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CPU cores like 0 or 0-3,6; got {text!r}") from None
    if not cores or min(cores) < 0:
        raise argparse.ArgumentTypeError(f"expected CPU cores like 0 or 0-3,6; got {text!r}")
    return tuple(sorted(set(cores)))


def _check_data_parallel(config) -> None:
    """Under torchrun (WORLD_SIZE > 1): a set-up the ranks cannot run is refused before anything loads."""
    import os

    from gym_llm_adapters.training.distributed import DataParallelError, check_data_parallel

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1:
        try:
            check_data_parallel(config, world=world, local_world=int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
        except DataParallelError as e:
            raise UsageError(str(e)) from e


def run(args: argparse.Namespace) -> int:
    import gym_llm  # noqa: F401
    from gym_llm_adapters.training import Trainer

    # every input is checked before a model is loaded or an engine started
    check_env(args.env, "train")
    _check_config_file(args)
    check_paths(env_kwargs_from(args))
    check_paths(dict(args.eval_env_args))
    _check_out(args.out, args.resume)
    _, tokenizer, longest = check_model(args.model)
    args.max_seq_len = fit_seq_len(args.max_seq_len, longest, default=2048, max_new_tokens=args.max_new_tokens)
    try:
        config = config_from_args(args)
    except (ValueError, ImportError) as e:  # a cross-field check of TrainConfig, or a --report-to not installed
        raise UsageError(str(e)) from e
    _check_lora(config, args.resume)
    _check_data_parallel(config)
    evaluation = (args.env, {**config.env_kwargs, **config.eval_env_kwargs}) if args.eval_env is None else \
        (args.eval_env, dict(config.eval_env_kwargs))
    if args.eval_env is not None:
        check_env(args.eval_env, "train")
    for env_id, kwargs in ((args.env, config.env_kwargs), evaluation):  # training and eval envs
        probe_env(env_id, kwargs, mode="tokens", tokenizer=tokenizer, max_seq_len=config.max_seq_len,
                  max_action_tokens=config.max_new_tokens)
    if config.judge is not None:
        _check_judge(config, args.env)
    from tqdm.contrib.logging import logging_redirect_tqdm

    from gym_llm_adapters.cli._output import log_to
    from gym_llm_adapters.training.checkpoint import CheckpointError

    log_to(config.out_dir / "train.log", command="train")  # the dependencies' messages, from here on (not with -v)

    from gym_llm_adapters.training.sft_data import SFTDataError

    try:
        trainer = Trainer(config, resume=args.resume)  # a resumed run's state files are read (as data) here
    except CheckpointError as e:
        raise UsageError(str(e)) from e
    except SFTDataError as e:  # a fresh run reads the warm start's data before any model loads
        raise UsageError(f"the SFT warm start has no data: {e}") from e
    with trainer, logging_redirect_tqdm():  # logs print above the bar
        try:
            result = trainer.run()
        except SFTDataError as e:  # a resumed run reads it when its SFT phase starts
            raise UsageError(f"the SFT warm start has no data: {e}") from e
    if not trainer.is_main:  # a data-parallel rank other than 0: rank 0 says what the run did
        return 130 if result.interrupted else 0
    first, last = (result.evals[0], result.evals[-1]) if result.evals else (None, None)
    if first is not None:
        print(f"eval at step {first[0]}: mean reward {first[1].reward_mean:.3f}, pass rate {first[1].pass_rate:.1%}")
        print(f"eval at step {last[0]}: mean reward {last[1].reward_mean:.3f}, pass rate {last[1].pass_rate:.1%}")
    if result.step_time:
        from gym_llm_adapters.training.step_time import format_step_time

        print(f"a GRPO step's time (mean of this run): {format_step_time(result.step_time)}")
    if result.throughput:
        from gym_llm_adapters.training.throughput import format_throughput

        perf = result.throughput
        print(f"throughput (mean of this run): {format_throughput(perf, perf['peak_flops'], config.dtype)}")
    print(f"{'interrupted' if result.interrupted else 'done'} after {result.steps} steps; "
          f"checkpoint {result.checkpoint}; curves {config.out_dir / 'curves.png'}; "
          f"metrics {config.out_dir / 'metrics.jsonl'}")
    return 130 if result.interrupted else 0
