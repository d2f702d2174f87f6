"""Reference-KL cost: gym-llm's ReferenceKL vs one raw reference forward, and vs TorchRL's KL transforms.

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=.:adapters python bench/kl.py [--vocab 32000] [--batch 16] [--seq 512]``
(``--model smollm2``: SmolLM2-135M-Instruct's real shape and weights instead of the small random model;
``--group-size 8``: GRPO-shaped batches, 8 rows per prompt, which ReferenceKL runs once per prompt).

All three compute, for the same right-padded batch of episodes, the reference model's log-prob of every
sampled (policy) token and the KL estimate against the engine's log-probs, under ``torch.inference_mode``:

* raw: ``model(input_ids, attention_mask).logits`` + ``gather`` of the next tokens' logits — the floor of any
  full-logits approach (it does not even normalise: no log-softmax);
* ours: :class:`gym_llm_adapters.kl.ReferenceKL` (backbone forward, output head on policy tokens only, chunked
  logsumexp, KL, reward shaping);
* TorchRL 0.14.1: ``RetrieveLogProb(TransformersWrapper(ref, input_mode="tokens", generate=False))`` +
  ``KLComputation`` — the reference half of ``RetrieveKL``, given the engine's log-probs as the generation
  log-probs (``RetrieveKL`` itself would also re-run the policy model, a second forward). TorchRL's
  ``assistant_only`` needs chat-history input, so its KL is masked to policy tokens afterwards.

Prints each time, the ratios, and checks that the three agree on the per-sequence KL.
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch
from _common import bench_model, describe_machine, interleaved_times_s, rollout_batch, summary

from gym_llm_adapters.kl import ReferenceKL, ReferenceKLConfig
from gym_llm_adapters.logprobs import token_logprobs
from gym_llm_adapters.engines import cpu_paths


def raw_forward(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, S, V)
    return logits[:, :-1].gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)


def torchrl_chain(model, tokenizer_dir):
    """TorchRL's reference log-prob transform + KL transform, and a function that runs them on a batch."""
    from tensordict import TensorDict, lazy_stack, set_list_to_stack
    from torchrl.envs.llm.transforms.kl import KLComputation, RetrieveLogProb
    from torchrl.modules.llm import TransformersWrapper
    from transformers import AutoTokenizer

    set_list_to_stack(True).set()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    wrapper = TransformersWrapper(model, tokenizer=tokenizer, input_mode="tokens", generate=False,
                                  return_log_probs=True, pad_output=True, log_probs_key="ref_log_probs")
    retrieve = RetrieveLogProb(wrapper, assistant_only=False)
    kl = KLComputation(gen_log_probs_full_key=("log_probs", "full"),
                       ref_log_probs_full_key=("ref_log_probs", "full"), add_to_reward=False)

    def run(batch, engine_logprobs):
        lengths = batch["attention_mask"].sum(1).tolist()
        S = batch["input_ids"].shape[1]
        rows = []
        for b, n in enumerate(lengths):
            # TorchRL pads on the left: the engine log-probs are given in that layout.
            gen = torch.zeros(S)
            gen[S - n:] = engine_logprobs[b, :n]
            rows.append(TensorDict({("tokens", "full"): batch["input_ids"][b, :n], ("log_probs", "full"): gen}))
        out = kl(retrieve(lazy_stack(rows)))
        per_token = out.get("kl_penalty", as_padded_tensor=True)  # (B, S) left-padded
        mask = torch.zeros(len(lengths), S, dtype=torch.bool)
        for b, n in enumerate(lengths):
            mask[b, S - n:] = batch["policy_mask"][b, :n]
        return (per_token * mask).sum(-1)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["small", "smollm2"], default="small",
                        help="small: a 4-layer random Qwen2 with --vocab outputs; smollm2: SmolLM2-135M-Instruct")
    parser.add_argument("--vocab", type=int, default=32000, help="output size of the small model")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per episode (not scored)")
    parser.add_argument("--dense", action="store_true", help="every episode fills the sequence: no padding")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=4096,
                        help="ReferenceKLConfig.max_tokens_per_forward (0 = None: one forward)")
    parser.add_argument("--group-size", type=int, default=1,
                        help="rows per GRPO group (they share their prompt); > 1 turns on ReferenceKL's share_prefix")
    parser.add_argument("--skip-torchrl", action="store_true")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the record here, one file per shape (bench/results/kl.json for the default, "
                             "kl_<shape>.json for others; see scripts/render_benchmarks.py)")
    args = parser.parse_args()
    print(f"machine: {cpu_paths.describe()}")  # every number below is this machine's
    warnings.filterwarnings("ignore")
    from gym_llm_adapters.models.tiny import tiny_model_dir

    ref_model, model_dir, vocab = bench_model(args.model, args.vocab, seed=1)
    policy_model, _, _ = bench_model(args.model, args.vocab, seed=0)
    args.vocab = vocab
    batch = rollout_batch(args.batch, args.seq, args.prompt, args.vocab, dense=args.dense, group_size=args.group_size)
    with torch.inference_mode():
        engine = token_logprobs(policy_model, batch["input_ids"], batch["attention_mask"], batch["policy_mask"])
    del policy_model
    rewards = torch.zeros(args.batch)
    reference_kl = ReferenceKL(ref_model, ReferenceKLConfig(
        estimator="k1", reward_coef=0.05, max_tokens_per_forward=args.max_tokens or None,
        share_prefix=args.group_size > 1))

    def ours():
        return reference_kl.compute(batch["input_ids"], batch["attention_mask"], batch["policy_mask"], engine,
                                    rewards)

    def raw():
        with torch.inference_mode():
            return raw_forward(ref_model, batch)

    fns = {"raw": raw, "ours": ours}
    if not args.skip_torchrl:
        run_torchrl = torchrl_chain(ref_model, model_dir or tiny_model_dir())

        def torchrl():
            with torch.inference_mode():
                return run_torchrl(batch, engine)

        # Same numbers first: TorchRL's k1 (gen - ref) summed over policy tokens equals ours.
        torch.testing.assert_close(ours().kl_per_sequence, torchrl().float(), rtol=1e-3, atol=1e-2)
        fns["torchrl"] = torchrl
    print(f"# reference KL ({args.model} model): B={args.batch} S={args.seq} V={args.vocab} prompt={args.prompt}; "
          f"{int(batch['policy_mask'].sum())} policy tokens of {int(batch['attention_mask'].sum())} real tokens; "
          f"groups of {args.group_size}; {args.repeats} interleaved runs; {describe_machine()}")
    times = interleaved_times_s(fns, repeats=args.repeats)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"raw reference forward (logits + gather): {summary(times['raw'])}")
    print(f"gym-llm ReferenceKL:                     {summary(times['ours'])}")
    print(f"ratio ours / raw forward:                {med['ours'] / med['raw']:6.3f}   (target <= 1.1)")
    if "torchrl" in times:
        print(f"TorchRL RetrieveLogProb + KLComputation: {summary(times['torchrl'])}   (same per-sequence KL: checked)")
        print(f"speed-up ours vs TorchRL:                {med['torchrl'] / med['ours']:6.2f}x  (target >= 2)")
    if args.json:
        write_json(args, med, times)


def write_json(args: argparse.Namespace, med: dict[str, float], times: dict[str, list[float]]) -> None:
    """The record of this run: one row, a headline at the default shape (the small model, B=16 S=512)."""
    from _common import bench_record, write_record

    shape = f"B={args.batch} S={args.seq} V={args.vocab // 1000}k" + (
        f" (groups of {args.group_size})" if args.group_size > 1 else "")
    model = "" if args.model == "small" else " at a real shape: SmolLM2-135M,"
    row = {"what": f"reference KL{model} {shape}", "ours": f"{med['ours']:.2f} s",
           "baseline": f"raw reference forward {med['raw']:.2f} s",
           "ratio": f"**{med['ours'] / med['raw']:.2f} of raw**",
           "target": "≤ 1.1 of raw"}
    if "torchrl" in med:
        row["baseline"] += f"; TorchRL `RetrieveLogProb`+`KLComputation` {med['torchrl']:.2f} s"
        row["ratio"] += f", **{med['torchrl'] / med['ours']:.2f}x** vs TorchRL"
        row["target"] += ", ≥ 2x vs TorchRL"
        if args.model == "small" and (args.batch, args.seq) == (16, 512):
            row.update(headline=True, headline_what=f"reference KL, {shape}",
                       headline_ratio=f"**{med['torchrl'] / med['ours']:.2f}x** TorchRL's "
                                      f"`RetrieveLogProb`+`KLComputation`; {med['ours'] / med['raw']:.2f} of a raw "
                                      "forward")
    write_record(args.json, bench_record("kl.py", title=f"Reference KL, {args.model} model, {shape}", order=40,
                                         rows=[row], figures={"median_s": med, "times_s": times}))


if __name__ == "__main__":
    main()
