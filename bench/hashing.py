"""LLMHashing-v0 vs TorchRL's LLMHashingEnv: batch steps per second, with and without text output.

    python bench/hashing.py [--batch 64] [--prompt-tokens 128] [--steps 128] [--repeat 3]

Setting: B sub-envs, each with a random prompt of P token ids, then S steps of one random token per
sub-env; Qwen2.5's real tokenizer (151,646 ids) decodes the text. Both envs run in this process, one
after the other, ``--repeat`` times; the best run of each is reported (other load only slows a run).

* ours: ``LLMHashingVectorEnv(B, ...)`` — numpy batch state, chain hash ``h <- H(h, token)``, text
  decoded incrementally (each new token's bytes from a table, through a per-row UTF-8 decoder);
* TorchRL 0.14: ``torchrl.envs.llm.LLMHashingEnv`` with a batch-B TensorDict — SipHash of
  ``(h, token)`` per row, text by ``batch_decode`` of every full sequence each step.

Both see the same prompts and actions (rows may pair them differently: same work); the bench checks
our final hash against :func:`~gym_llm.envs.hashing.chain_hash.chain_hash` and our text against decoding the
whole sequence.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "adapters")]

from gym_llm.envs.hashing.chain_hash import chain_hash  # noqa: E402
from gym_llm.envs.hashing import LLMHashingVectorEnv  # noqa: E402
from gym_llm_adapters.engines import cpu_paths  # noqa: E402


def run_ours(tokenizer, prompts: np.ndarray, actions: np.ndarray, text: bool) -> tuple[float, dict]:
    B, P = prompts.shape
    S = len(actions)
    envs = LLMHashingVectorEnv(B, prompts=prompts.tolist(), tokenizer=tokenizer, max_seq_len=P + S + 1,
                               eos_token_ids=(), text_output=text, task_order="sequential")
    obs, _ = envs.reset(seed=0)
    start = time.perf_counter()
    for step in range(S):
        obs, _, _, _, _ = envs.step(actions[step])
    rate = S / (time.perf_counter() - start)
    envs.close()
    return rate, obs


def run_torchrl(tokenizer, prompts: np.ndarray, actions: np.ndarray, text: bool) -> tuple[float, object]:
    import torch
    from tensordict import TensorDict
    from torchrl.envs.llm import LLMHashingEnv

    B = prompts.shape[0]
    env = LLMHashingEnv(vocab_size=len(tokenizer), tokenizer=tokenizer, text_output=text)
    td = env.reset(TensorDict(observation=torch.as_tensor(prompts), batch_size=[B]))
    torch_actions = torch.as_tensor(actions).unsqueeze(-1)  # (S, B, 1)
    start = time.perf_counter()
    for step in range(len(actions)):
        td["action"] = torch_actions[step]
        td = env.step(td)["next"]
    return len(actions) / (time.perf_counter() - start), td


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="B, sub-envs")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="P, prompt length")
    parser.add_argument("--steps", type=int, default=128, help="S, steps (tokens per sub-env)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best is reported")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the record here (bench/results/hashing.json; see "
                             "scripts/render_benchmarks.py)")
    args = parser.parse_args()
    print(f"machine: {cpu_paths.describe()}")  # every number below is this machine's
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from gym_llm_adapters.models.tokenizers import qwen2_tokenizer

    tokenizer = qwen2_tokenizer()
    rng = np.random.default_rng(0)
    # Ids of ordinary tokens (the specials at the top of Qwen's vocabulary would end nothing here anyway).
    prompts = rng.integers(0, 151_643, size=(args.batch, args.prompt_tokens))
    actions = rng.integers(0, 151_643, size=(args.steps, args.batch))
    load_before = os.getloadavg()
    results = {}
    for text in (False, True):
        ours, theirs = [], []
        for _ in range(args.repeat):
            rate, obs = run_ours(tokenizer, prompts, actions, text)
            ours.append(rate)
            rate, td = run_torchrl(tokenizer, prompts, actions, text)
            theirs.append(rate)
        full = obs["input_ids"][0][obs["attention_mask"][0] == 1]
        assert np.array_equal(full[-args.steps:], actions[:, 0]) and int(obs["hash"][0, 0]) == chain_hash(full)
        if text:  # incremental text == decoding the whole sequence, but a pending U+FFFD tail
            reference = tokenizer.decode(full.tolist(), skip_special_tokens=False)
            pending = reference[len(obs["text"][0]):]
            assert reference.startswith(obs["text"][0]) and set(pending) <= {"\ufffd"}, "text differs"
        results[text] = (max(ours), max(theirs))
    print(f"LLMHashing steps/s: B={args.batch}, prompt={args.prompt_tokens} tokens, {args.steps} steps, "
          f"Qwen2.5 tokenizer, best of {args.repeat}; load average before/after {load_before} / {os.getloadavg()}")
    print(f"{'text':<6}{'gym-llm':>12}{'TorchRL':>12}{'ratio':>9}{'target':>9}")
    for text, target in ((False, 3), (True, 10)):
        ours, theirs = results[text]
        print(f"{str(text):<6}{ours:>12.0f}{theirs:>12.0f}{ours / theirs:>8.1f}x{target:>8}x")
    print("(batch steps per second; each batch step is one token for each of the B sub-envs)")
    if args.json:
        from _common import bench_record, write_record

        (ours_raw, theirs_raw), (ours_text, theirs_text) = results[False], results[True]
        row = {"what": f"hashing env, B={args.batch}, {args.prompt_tokens}-token prompts, steps/s",
               "ours": f"{ours_raw:,.0f} (no text) / {ours_text:,.0f} (text)",
               "baseline": f"TorchRL `LLMHashingEnv` {theirs_raw:,.0f} / {theirs_text:,.0f}",
               "ratio": f"**{ours_raw / theirs_raw:.1f}x / {ours_text / theirs_text:.1f}x**",
               # not a README headline: the README's table holds 12 rows and this one was left out of it
               "target": "≥ 3x / ≥ 10x",
               "headline_what": f"hashing env steps/s, B={args.batch}, {args.prompt_tokens}-token prompts",
               "headline_ratio": f"**{ours_raw / theirs_raw:.1f}x / {ours_text / theirs_text:.1f}x** TorchRL's "
                                 "`LLMHashingEnv` (no text / text)"}
        figures = {"steps_per_s": {"ours": ours_raw, "torchrl": theirs_raw, "ours_text": ours_text,
                                   "torchrl_text": theirs_text}, "batch": args.batch,
                   "prompt_tokens": args.prompt_tokens, "steps": args.steps, "repeat": args.repeat}
        write_record(args.json, bench_record("hashing.py", title="Hashing env steps per second", order=30, rows=[row],
                                             figures=figures))


if __name__ == "__main__":
    main()
