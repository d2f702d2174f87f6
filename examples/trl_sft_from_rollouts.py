"""Rejection-sampling SFT with TRL's SFTTrainer on gym_llm rollouts: sample GRPO-style groups from an env, keep the
best episode of each group (and only rewarded ones), fine-tune on them.

For a GPU machine with vLLM and the Hugging Face hub (not run on a GPU by this project yet; the --tiny run below is
what CI runs): Qwen2.5-0.5B-Instruct samples LLMPythonTool-v0 episodes
on GSM8K train with in-process vLLM, then SFTTrainer fine-tunes on the correct ones, bf16:

    python examples/trl_sft_from_rollouts.py
    python examples/trl_sft_from_rollouts.py --rollouts runs/trl_grpo_gsm8k/rollouts.jsonl

The second form skips sampling and fine-tunes on episodes written by ``trl_grpo_gsm8k.py --python-tool``.

Tiny CPU run (offline: the tiny random checkpoint samples with transformers, generated GSM-style problems; its
episodes earn no reward, so every group's best one is kept; about half a minute, most of it imports):

    python examples/trl_sft_from_rollouts.py --tiny

Episodes are exported as ``input_ids`` + ``assistant_masks`` (``--format tokens``, the default: token-exact, the loss
covers exactly the tokens the policy sampled, never the prompt or the tool output) or as ``messages``
(``--format messages``: conversations re-rendered by the chat template, with ``assistant_only_loss=True``).
Run from the checkout with gym-llm installed (``bash scripts/setup.sh``), or with ``PYTHONPATH=.:adapters``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from _common import parse_args, report  # examples/_common.py: flags from the dataclass, --tiny, the report


@dataclass
class Args:
    tiny: bool = False
    """CPU smoke run: the tiny offline checkpoint, transformers sampling, generated problems, a few steps"""
    rollouts: str | None = None
    """fine-tune on this rollout file/folder instead of sampling new episodes"""
    env: str = "LLMPythonTool-v0"
    """the gym_llm env to sample from"""
    model: str = "Qwen/Qwen2.5-0.5B-Instruct"
    data_files: str | None = None
    """a GSM8K .jsonl; default: GSM8K train from the hub (--tiny: generated offline)"""
    num_tasks: int = 64
    """problems per sampling batch"""
    group_size: int = 8
    """samples per problem"""
    num_batches: int = 4
    max_tokens: int = 512
    """tokens per assistant turn"""
    top_k: int = 1
    """episodes kept per group (the highest returns)"""
    min_reward: float | None = 1.0
    """keep only episodes whose return is at least this (--tiny: none, all rewards are 0)"""
    format: str = "tokens"
    """'tokens' (input_ids + assistant_masks) or 'messages' (conversations, assistant_only_loss)"""
    max_steps: int = 100
    per_device_train_batch_size: int = 8
    learning_rate: float = 1e-5
    output_dir: str = "runs/trl_sft_from_rollouts"
    seed: int = 0


TINY = dict(num_tasks=2, group_size=2, num_batches=1, max_tokens=16, min_reward=None, max_steps=2,
            per_device_train_batch_size=2, learning_rate=1e-4)


def sample_rollouts(args: Args, model: str, path: Path) -> None:
    """Sample ``num_batches`` batches of whole groups from the env and write them to ``path``."""
    import gymnasium as gym

    import gym_llm  # noqa: F401  (registers the env ids)
    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.engines import HFEngine, SamplingConfig, VLLMEngine
    from gym_llm_adapters.rollout_io import RolloutWriter

    if args.tiny:
        engine = HFEngine(model)
        source = {"data_files": args.data_files} if args.data_files else {"source": "gsm_symbolic", "num_generated": 64}
    else:
        engine = VLLMEngine(model, dtype="bfloat16", gpu_memory_utilization=0.3, seed=args.seed)
        source = {"data_files": args.data_files} if args.data_files else {"source": "hub", "split": "train"}
    num_envs = args.num_tasks * args.group_size
    envs = gym.make_vec(args.env, num_envs=num_envs, group_size=args.group_size, vectorization_mode="vector_entry_point",
                        mode="tokens", tokenizer=engine.tokenizer, max_action_tokens=args.max_tokens,
                        record_messages=True, **source)
    with Collector(envs, engine, SamplingConfig(max_tokens=args.max_tokens), episodes_per_batch=num_envs,
                   seed=args.seed, writer=RolloutWriter(path), progress=not args.tiny) as collector:
        for batch in collector.collect(args.num_batches):
            print(f"sampled {len(batch)} episodes, mean return {sum(t.reward for t in batch) / len(batch):.3f}")
    envs.close()
    engine.close()


def main() -> dict:
    args = parse_args(Args, {"tiny": TINY})
    from trl import SFTConfig, SFTTrainer

    from gym_llm_adapters.trl import sft_dataset

    model = args.model
    if args.tiny:
        from gym_llm_adapters.models.tiny import tiny_model_dir

        model = str(tiny_model_dir())
    rollouts = Path(args.rollouts) if args.rollouts else Path(args.output_dir) / "rollouts.jsonl"
    if not args.rollouts:
        rollouts.parent.mkdir(parents=True, exist_ok=True)
        rollouts.unlink(missing_ok=True)  # a fresh sample, not an append to an earlier run's
        sample_rollouts(args, model, rollouts)
    dataset = sft_dataset(rollouts, format=args.format, top_k=args.top_k, min_reward=args.min_reward)
    print(f"fine-tuning on {len(dataset)} episodes (top {args.top_k} per group, min reward {args.min_reward})")
    config = SFTConfig(output_dir=args.output_dir, max_steps=args.max_steps, learning_rate=args.learning_rate,
                       per_device_train_batch_size=args.per_device_train_batch_size,
                       assistant_only_loss=args.format == "messages", bf16=not args.tiny, use_cpu=args.tiny,
                       logging_steps=1, save_strategy="no", report_to=[], seed=args.seed)
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset)
    trainer.train()
    return report(trainer, {}, save_to=None if args.tiny else args.output_dir)


if __name__ == "__main__":
    main()
