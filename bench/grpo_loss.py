"""GRPO loss forward + backward: gym-llm vs TRL 1.16's GRPOTrainer._compute_loss on the same batch and model.

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=.:adapters python bench/grpo_loss.py [--vocab 32000] [--batch 16] [--seq 512]``
(``--model smollm2``: SmolLM2-135M-Instruct's real shape and weights instead of the small random model;
``--group-size 8``: GRPO-shaped batches, 8 rows per prompt, whose prompts token_logprobs runs once).

Both sides start from token ids and end with parameter gradients, so the policy forward (the part that
makes the backward real) is inside the timing:

* TRL: a real ``GRPOTrainer`` (``loss_type="dapo"``, ``beta``, ``epsilon_high``, vLLM truncated importance
  sampling) runs ``_compute_loss(model, inputs)`` — its fused-LM-head forward (log-probs and entropy of
  every position) and the loss — then ``loss.backward()``;
* ours: :func:`gym_llm_adapters.logprobs.token_logprobs` (policy tokens only, length-bucketed forwards) and
  :class:`gym_llm_adapters.losses.GRPOLoss` with the mapped options, then ``loss.backward()``.

Old, reference and engine log-probs, advantages and masks are shared; the script first checks that both
losses are equal, then times them interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import warnings

import torch
from _common import bench_model, describe_machine, interleaved_times_s, rollout_batch, summary

from gym_llm_adapters.logprobs import token_logprobs
from gym_llm_adapters.losses import GRPOLoss, GRPOLossConfig, group_advantages, importance_sampling_weights
from gym_llm_adapters.engines import cpu_paths

OPTIONS = dict(loss_type="dapo", beta=0.04, epsilon=0.2, epsilon_high=0.28,
               vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=2.0)
CONFIG = GRPOLossConfig(aggregation="token_mean", beta=0.04, epsilon=0.2, epsilon_high=0.28,
                        importance_sampling="token_truncate", importance_sampling_clip_max=2.0)


def build_trainer(model_dir, batch_size: int, completion_length: int, tokenizer=None):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from gym_llm_adapters.models.tokenizers import tiny_tokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="bench-grpo-"), per_device_train_batch_size=batch_size,
                      num_generations=4, max_completion_length=completion_length, report_to=[], use_cpu=True,
                      bf16=False, **OPTIONS)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["x"] * batch_size}),
                          processing_class=tokenizer or tiny_tokenizer())
    trainer.current_gradient_accumulation_steps = 1  # one micro-batch per optimizer step
    trainer.use_vllm = True  # makes _compute_loss apply inputs["importance_sampling_ratio"]; no engine is started
    return trainer


def shared_inputs(model, batch, prompt: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = batch["policy_mask"]
    with torch.no_grad():
        current = token_logprobs(model, batch["input_ids"], batch["attention_mask"], mask)
    noise = lambda scale: scale * torch.randn(mask.shape, generator=g) * mask  # noqa: E731
    B = mask.shape[0]
    rewards = torch.rand(B, generator=g).round()
    advantages = torch.from_numpy(group_advantages(rewards.numpy(), torch.arange(B).numpy() // 4))
    old = current + noise(0.1)
    return dict(old=old, engine=old + noise(0.1), ref=current + noise(0.3), advantages=advantages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["small", "smollm2"], default="small",
                        help="small: a 4-layer random Qwen2 with --vocab outputs; smollm2: SmolLM2-135M-Instruct")
    parser.add_argument("--vocab", type=int, default=32000, help="output size of the small model")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per episode (not scored)")
    parser.add_argument("--dense", action="store_true", help="every episode fills the sequence: no padding")
    parser.add_argument("--group-size", type=int, default=1,
                        help="rows per GRPO group (they share their prompt); > 1 turns on token_logprobs' share_prefix")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=4096, help="token_logprobs max_tokens_per_forward (0 = None)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the record here, one file per shape (bench/results/grpo_loss.json for the "
                             "default, grpo_loss_<shape>.json for others; see scripts/render_benchmarks.py)")
    args = parser.parse_args()
    print(f"machine: {cpu_paths.describe()}")  # every number below is this machine's
    warnings.filterwarnings("ignore")
    _, model_dir, args.vocab = bench_model(args.model, args.vocab, seed=0, save=True)
    tokenizer = None
    if args.model == "smollm2":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = build_trainer(model_dir, args.batch, args.seq - args.prompt, tokenizer)
    model = trainer.model.train()
    batch = rollout_batch(args.batch, args.seq, args.prompt, args.vocab, dense=args.dense, group_size=args.group_size)
    x = shared_inputs(model, batch, args.prompt)
    mask, P = batch["policy_mask"], args.prompt
    num_items = mask.sum().float()
    weights = importance_sampling_weights(x["old"], x["engine"], mask, "token_truncate", clip_max=2.0)
    trl_inputs = dict(prompt_ids=batch["input_ids"][:, :P], prompt_mask=batch["attention_mask"][:, :P],
                      completion_ids=batch["input_ids"][:, P:], completion_mask=mask[:, P:].long(),
                      advantages=x["advantages"], old_per_token_logps=x["old"][:, P:],
                      ref_per_token_logps=x["ref"][:, P:], importance_sampling_ratio=weights[:, P:],
                      num_items_in_batch=num_items)
    loss_fn = GRPOLoss(CONFIG)

    def trl_step():
        model.zero_grad(set_to_none=True)
        loss = trainer._compute_loss(model, trl_inputs)
        loss.backward()
        return loss.detach()

    def our_step():
        model.zero_grad(set_to_none=True)
        logprobs = token_logprobs(model, batch["input_ids"], batch["attention_mask"], mask,
                                  max_tokens_per_forward=args.max_tokens or None,
                                  share_prefix=args.group_size > 1)
        out = loss_fn(logprobs, mask=mask, advantages=x["advantages"], old_logprobs=x["old"],
                      engine_logprobs=x["engine"], ref_logprobs=x["ref"], num_items=num_items)
        out.loss.backward()
        return out.loss.detach()

    torch.testing.assert_close(our_step(), trl_step(), rtol=1e-4, atol=1e-6)
    print(f"# GRPO loss fwd+bwd ({args.model} model): B={args.batch} S={args.seq} V={args.vocab} prompt={P}; "
          f"{int(num_items)} policy tokens of {int(batch['attention_mask'].sum())} real tokens; TRL options "
          f"{OPTIONS}; groups of {args.group_size}; {args.repeats} interleaved runs; {describe_machine()}")
    times = interleaved_times_s({"trl": trl_step, "ours": our_step}, repeats=args.repeats)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"TRL GRPOTrainer._compute_loss + backward: {summary(times['trl'])}   (same loss value: checked)")
    print(f"gym-llm token_logprobs + GRPOLoss + bwd:  {summary(times['ours'])}")
    print(f"ratio ours / TRL:                         {med['ours'] / med['trl']:6.3f}   (target <= 1.0)")
    if args.json:
        write_json(args, med, times)


def write_json(args: argparse.Namespace, med: dict[str, float], times: dict[str, list[float]]) -> None:
    """The record of this run: one row, a headline at the default shape (the small model, B=16 S=512)."""
    import trl

    from _common import bench_record, write_record

    shape = f"B={args.batch} S={args.seq} V={args.vocab // 1000}k" + (
        f" (groups of {args.group_size})" if args.group_size > 1 else "")
    model = "" if args.model == "small" else " at a real shape: SmolLM2-135M,"
    row = {"what": f"GRPO loss fwd+bwd{model} {shape}", "ours": f"{med['ours']:.2f} s",
           "baseline": f"TRL {trl.__version__} `GRPOTrainer._compute_loss` + bwd {med['trl']:.2f} s",
           "ratio": f"**{med['ours'] / med['trl']:.2f}**", "target": "≤ 1.0"}
    if args.model == "small" and (args.batch, args.seq) == (16, 512):
        row.update(headline=True, headline_what=f"GRPO loss fwd+bwd, {shape}",
                   headline_ratio=f"**{med['ours'] / med['trl']:.2f}** of the time of TRL {trl.__version__}'s "
                                  "`GRPOTrainer._compute_loss` + bwd")
    write_record(args.json, bench_record("grpo_loss.py", title=f"GRPO loss forward and backward, {args.model} model, "
                                         f"{shape}", order=50, rows=[row], figures={"median_s": med, "times_s": times}))


if __name__ == "__main__":
    main()
