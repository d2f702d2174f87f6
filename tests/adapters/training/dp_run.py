"""One data-parallel GRPO run, started by tests/adapters/training/test_data_parallel.py under
``torchrun --nproc-per-node 2 -m tests.adapters.training.dp_run OUT STEPS AGGREGATION [lora] [resume] [ddp|fsdp]``:
trains (a LoRA adapter with ``lora``; continuing OUT/run with ``resume``; ``--sharding`` auto unless named), then every
rank saves its final trainable weights, whole (FSDP2's shards gathered), to ``OUT/rank-<r>.pt`` (the test compares
them with each other and with one process's)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

import gym_llm  # noqa: F401
from gym_llm_adapters.training import TrainConfig, Trainer

PROMPTS = ["Say something.", "Name a colour.", "Count to three.", "Greet me."]


def length_reward(task, messages) -> float:
    """A reward a random-init model's replies differ on (so groups have something to learn from)."""
    return float(len(messages[-1].content) % 5)


def dp_config(out_dir: Path, *, steps: int, aggregation: str, lora: bool = False, sharding: str = "auto") -> TrainConfig:
    return TrainConfig(sharding=sharding, lora_rank=4 if lora else None, algorithm="grpo", env_id="LLMChat-v0", model="tiny", out_dir=out_dir, engine="hf", device="cpu",
                       env_kwargs={"prompts": PROMPTS, "max_turns": 1, "reward_fn": length_reward},
                       sft_warmup_steps=0, steps=steps, num_tasks=4, group_size=4, max_new_tokens=12, max_seq_len=96,
                       learning_rate=5e-3, lr_warmup_steps=0, beta=0.04, temperature=1.0, micro_batch_size=4,
                       aggregation=aggregation, eval_every=0, eval_episodes=4, save_every=100, progress=False)


def main() -> None:
    out, steps, aggregation, flags = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], set(sys.argv[4:])
    sharding = next((f for f in ("ddp", "fsdp") if f in flags), "auto")
    config = dp_config(out / "run", steps=steps, aggregation=aggregation, lora="lora" in flags, sharding=sharding)
    with Trainer(config, resume="resume" in flags) as trainer:
        rank, world = trainer.dp.rank, trainer.dp.world
        result = trainer.run()
        weights = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                   for k, v in trainer.policy.named_parameters() if v.requires_grad}
        shard = [type(v).__name__ for v in trainer.policy.parameters()][0]
        torch.save({"weights": weights, "steps": result.steps, "world": world, "strategy": trainer.dp.strategy,
                    "parameter_type": shard, "checkpoint": str(result.checkpoint)}, out / f"rank-{rank}.pt")
    assert not dist.is_initialized()  # the trainer's close() ended the process group


if __name__ == "__main__":
    main()
