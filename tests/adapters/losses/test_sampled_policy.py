"""The policy that was sampled is the policy that is trained: temperature / top-k / top-p, stale turns, truncation.

* The kept set of top-k / top-p and the log-probs under it are checked against a plain Python loop over each
  row's sorted probabilities (float64), values and gradients.
* The engines in ``logprobs_mode="processed"`` report, for the tokens they sampled at temperature 0.7 / top-p 0.9,
  the log-probs ``token_logprobs`` computes for the same settings (transformers and vLLM): the engine/trainer
  ratio is 1 and the KL to a reference equal to the policy is 0, in the built-in trainer's first step too.
* Stale tokens (sampled by an older policy version) take their ratio against the behaviour policy, or leave the
  loss; truncated episodes leave it with ``mask_truncated``; Dr. GRPO's constant is per episode.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from gym_llm_adapters.engines import SamplingConfig
from gym_llm_adapters.logprobs import restrict_to_sampled_set, token_logprobs
from gym_llm_adapters.losses import GRPOLoss, GRPOLossConfig
from gym_llm_adapters.types import RolloutBatch, Trajectory

T, TOP_P = 0.7, 0.9


def kept_by_loop(logits_row: list[float], temperature: float, top_k: int, top_p: float) -> list[int]:
    """The token ids the sampler may draw: sort by probability, keep the top k, then keep tokens while the mass
    before them (renormalised within the top k) is < top_p. Independent of the code under test."""
    scaled = [z / temperature for z in logits_row]
    m = max(scaled)
    probs = [math.exp(z - m) for z in scaled]
    order = sorted(range(len(probs)), key=lambda v: -probs[v])
    if top_k:
        order = order[:top_k]
    total = sum(probs[v] for v in order)
    kept, before = [], 0.0
    for v in order:
        if before >= top_p:
            break
        kept.append(v)
        before += probs[v] / total
    return kept


def logprob_by_loop(logits_row: list[float], target: int, temperature: float, top_k: int, top_p: float) -> float:
    kept = set(kept_by_loop(logits_row, temperature, top_k, top_p)) | {target}
    scaled = [z / temperature for z in logits_row]
    m = max(scaled[v] for v in kept)
    return scaled[target] - m - math.log(sum(math.exp(scaled[v] - m) for v in kept))


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    from gym_llm_adapters.models.tiny import tiny_model_dir

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32).eval()


@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (5, 1.0), (20, 0.8), (0, 0.3)])
def test_kept_set_matches_the_loop(top_k, top_p):
    g = torch.Generator().manual_seed(top_k * 100 + int(top_p * 10))
    logits = torch.randn(6, 50, generator=g, dtype=torch.float64) * 3
    restricted = restrict_to_sampled_set(logits / T, top_k=top_k, top_p=top_p)
    for row in range(6):
        kept = sorted(kept_by_loop(logits[row].tolist(), T, top_k, top_p))
        assert torch.isfinite(restricted[row]).nonzero().flatten().tolist() == kept


@pytest.mark.parametrize("top_k,top_p", [(0, TOP_P), (7, 1.0), (30, 0.8)])
@pytest.mark.parametrize("chunk_bytes", [512 * 4 * 3, 1 << 30], ids=["3-row-chunks", "one-chunk"])
def test_token_logprobs_under_the_sampled_distribution(model, top_k, top_p, chunk_bytes):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, model.config.vocab_size, (3, 14), generator=g)
    attention = torch.ones_like(ids)
    score = torch.zeros_like(ids)
    score[:, 5:] = 1
    with torch.no_grad():
        got = token_logprobs(model, ids, attention, score, temperature=T, top_k=top_k, top_p=top_p,
                             chunk_bytes=chunk_bytes)
        logits = model(input_ids=ids, attention_mask=attention).logits.double()
    for b in range(3):
        for t in range(5, 14):
            want = logprob_by_loop(logits[b, t - 1].tolist(), int(ids[b, t]), T, top_k, top_p)
            assert abs(float(got[b, t]) - want) < 2e-5, (b, t)
    # random targets fall outside the kept set: their log-prob is still finite (the set widens to them)
    assert torch.isfinite(got).all() and (got[score == 0] == 0).all()


def test_gradient_is_that_of_the_renormalised_softmax_on_the_kept_set():
    from gym_llm_adapters.logprobs import _LinearTokenLogProb

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(40, 4, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.tensor([0, 6, 3, 3, 1])
    out = _LinearTokenLogProb.apply(hidden, weight, None, targets, 1 / T, 2, 0, TOP_P)
    with torch.no_grad():
        logits = hidden @ weight.t()
        kept = torch.zeros(5, 40, dtype=torch.bool)
        for row in range(5):
            kept[row, kept_by_loop(logits[row].tolist(), T, 0, TOP_P) + [int(targets[row])]] = True
    scaled = (hidden @ weight.t()) / T
    want = scaled.masked_fill(~kept, float("-inf")).log_softmax(-1).gather(1, targets[:, None]).squeeze(1)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    upstream = torch.randn(5, dtype=torch.float64, generator=g)
    got = torch.autograd.grad((out * upstream).sum(), (hidden, weight))
    expected = torch.autograd.grad((want * upstream).sum(), (hidden, weight))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


def _engine_vs_trainer(engine, model, tokenizer) -> tuple[float, float]:
    """Sample at T / top-p, then the largest |engine - trainer| log-prob gap and the KL to a reference = policy."""
    from gym_llm_adapters.kl import ReferenceKL, ReferenceKLConfig

    prompts = [tokenizer.encode(p) for p in ("What is 2 + 3?", "Tell me a story", "Count: 1 2 3", "Hello")]
    sampling = SamplingConfig(n=4, max_tokens=24, temperature=T, top_p=TOP_P, seed=11)
    completions = engine.generate(prompts, sampling)
    trajectories = []
    for c in completions:
        ids = np.concatenate([c.prompt_ids, c.token_ids])
        mask = np.r_[np.zeros(len(c.prompt_ids), np.int8), np.ones(len(c.token_ids), np.int8)]
        lps = np.r_[np.zeros(len(c.prompt_ids), np.float32), c.logprobs]
        trajectories.append(Trajectory(task_id=0, group_id=0, round=0, token_ids=ids, policy_mask=mask, logprobs=lps,
                                       prompt_length=len(c.prompt_ids), rewards=[0.0], versions=[0],
                                       terminated=True, truncated=False))
    batch = RolloutBatch.from_trajectories(trajectories)
    t = batch.to_torch()
    with torch.no_grad():
        trainer = token_logprobs(model, t["input_ids"], t["attention_mask"], t["policy_mask"], temperature=T,
                                 top_p=TOP_P)
    gap = float((trainer - t["logprobs"])[t["policy_mask"]].abs().max())
    raw_gap = None
    with torch.no_grad():  # the same tokens at temperature 1: what a raw-mode trainer would have used
        raw = token_logprobs(model, t["input_ids"], t["attention_mask"], t["policy_mask"])
        raw_gap = float((raw - t["logprobs"])[t["policy_mask"]].abs().max())
    kl = ReferenceKL(model, ReferenceKLConfig(temperature=T, top_p=TOP_P))(batch)
    assert raw_gap > 0.05, "the test needs settings where the processed and raw distributions differ"
    return gap, float(kl.kl.abs().max())


def test_transformers_engine_reports_the_log_probs_the_trainer_computes(model, tiny_model_path):
    from gym_llm_adapters.engines import HFEngine

    engine = HFEngine(tiny_model_path, logprobs_mode="processed")
    gap, kl = _engine_vs_trainer(engine, model, engine.tokenizer)
    assert gap < 1e-4 and kl < 1e-6, (gap, kl)


def vllm_checks(out_dir: str) -> dict[str, float]:
    """The vLLM engine check and the built-in trainer's first step (vLLM), in a process of their own: the test
    session's own vLLM engine lives in the parent, and two in-process engines cannot both be torn down cleanly."""
    from transformers import AutoModelForCausalLM

    from gym_llm_adapters.engines import VLLMEngine
    from gym_llm_adapters.models.tiny import tiny_model_dir
    from gym_llm_adapters.training import TrainConfig, Trainer

    path = tiny_model_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = VLLMEngine(path, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=32 << 20,
                        logprobs_mode="processed")
    try:
        gap, kl = _engine_vs_trainer(engine, model, engine.tokenizer)
    finally:
        engine.close()
    cfg = TrainConfig(algorithm="grpo", env_id="LLMGSM8K-v0", model="tiny", out_dir=f"{out_dir}/run", engine="vllm",
                      device="cpu", env_kwargs={"source": "arithmetic", "max_operand": 9}, steps=1, num_tasks=2,
                      group_size=4, max_new_tokens=16, max_seq_len=256, temperature=T, top_p=TOP_P, beta=0.04,
                      eval_every=0, eval_episodes=4, progress=False, write_rollouts=False,
                      vllm_kwargs={"kv_cache_memory_bytes": 32 << 20})
    with Trainer(cfg) as trainer:
        trainer.run()
    row = next(json.loads(line) for line in (cfg.out_dir / "metrics.jsonl").read_text().splitlines()
               if "train/loss" in line)
    return {"engine_gap": gap, "engine_kl": kl, **row}


def _vllm_command(out_dir):
    import os
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "adapters")]),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    return [sys.executable, str(Path(__file__).resolve()), str(out_dir)], env, repo


from tests import background  # noqa: E402

# the vLLM checks start when the suite is collected and run beside it (tests/background.py)
background.register("test_vllm_engine_reports_the_log_probs_the_trainer_computes", _vllm_command)


@pytest.fixture(scope="module")
def vllm_results():
    name = "test_vllm_engine_reports_the_log_probs_the_trainer_computes"
    done = background.result(name, timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_vllm_engine_reports_the_log_probs_the_trainer_computes(vllm_results):
    # vLLM's CPU kernels round differently from transformers' (measured < 1e-4 here); the ratio is 1 to 1e-3
    assert vllm_results["engine_gap"] < 1e-3 and vllm_results["engine_kl"] < 1e-6, vllm_results


@pytest.mark.slow
def test_trainer_first_step_is_on_policy_under_temperature_and_top_p(vllm_results):
    """The built-in trainer at temperature 0.7 / top-p 0.9 (vLLM): at the first GRPO step the trainer's log-probs
    equal the engine's (ratio 1) and the KL to the reference (= the policy at the start of RL) is 0."""
    row = vllm_results
    assert abs(row["train/engine_log_ratio_mean"]) < 1e-4 and row["train/engine_log_ratio_abs_max"] < 1e-3, row
    assert row["train/kl"] < 1e-6, row


# ---------------------------------------------------------------------------------------- stale turns, truncation
def _batch(token_versions, truncated=(False, False)) -> tuple[RolloutBatch, torch.Tensor]:
    """Two episodes, 6 tokens each, policy tokens at 1..5; engine log-probs and trainer log-probs differ."""
    policy = np.array([[0, 1, 1, 1, 1, 1]] * 2, np.int8)
    engine = np.where(policy, -1.0, 0.0).astype(np.float32)
    batch = RolloutBatch(input_ids=np.arange(12).reshape(2, 6), attention_mask=np.ones((2, 6), np.int8),
                         policy_mask=policy, logprobs=engine, rewards=np.array([1.0, 0.0], np.float32),
                         group_ids=np.zeros(2, np.int64), task_ids=np.zeros(2, np.int64),
                         rounds=np.zeros(2, np.int64), versions=np.zeros(2, np.int64),
                         advantages=np.array([1.0, -1.0], np.float32),
                         token_versions=np.where(policy, np.asarray(token_versions), -1).astype(np.int64),
                         truncated=np.asarray(truncated))
    current = torch.full((2, 6), -0.8, requires_grad=True)  # the trainer's log-probs now
    return batch, current


def test_stale_tokens_take_their_ratio_against_the_behaviour_policy():
    # episode 0: turn 1 (tokens 1-2) sampled by version 3, turn 2 (tokens 3-5) by version 4; episode 1: all by 4
    versions = [[0, 3, 3, 4, 4, 4], [0, 4, 4, 4, 4, 4]]
    batch, current = _batch(versions)
    out = GRPOLoss(GRPOLossConfig(epsilon=0.5)).from_batch(current, batch, current_version=4)
    grad = torch.autograd.grad(out.loss, current)[0]
    # on-policy tokens: ratio = 1, d loss / d logp = -A / n; stale ones: ratio = exp(-0.8 + 1.0) = e^0.2, in the
    # clip range [0.5, 1.5]: gradient -A * e^0.2 / n (10 policy tokens)
    n = 10
    assert torch.allclose(grad[0, 3:], torch.full((3,), -1.0 / n))
    assert torch.allclose(grad[0, 1:3], torch.full((2,), -math.exp(0.2) / n))
    assert torch.allclose(grad[1, 1:], torch.full((5,), 1.0 / n))
    assert abs(float(out.stale_fraction) - 0.2) < 1e-6
    # "ignore": the stale turn is treated as on-policy (ratio 1)
    ignored = GRPOLoss(GRPOLossConfig(stale_tokens="ignore")).from_batch(current, batch, current_version=4)
    assert torch.allclose(torch.autograd.grad(ignored.loss, current)[0][0, 1:3], torch.full((2,), -1.0 / n))
    # "mask": the stale turn leaves the loss; counted_tokens says the denominator to use
    masking = GRPOLoss(GRPOLossConfig(stale_tokens="mask"))
    assert masking.counted_tokens(batch, current_version=4) == 8
    masked = masking.from_batch(current, batch, current_version=4, num_items=8)
    grad = torch.autograd.grad(masked.loss, current)[0]
    assert (grad[0, 1:3] == 0).all() and torch.allclose(grad[0, 3:], torch.full((3,), -1.0 / 8))
    # a stale ratio far outside the clip range is clipped like any other: no gradient for A > 0 above 1 + eps
    far = dataclass_replace(batch, logprobs=np.where(batch.policy_mask, -3.0, 0.0).astype(np.float32))
    clipped = GRPOLoss(GRPOLossConfig(epsilon=0.2)).from_batch(current, far, current_version=4)
    assert (torch.autograd.grad(clipped.loss, current)[0][0, 1:3] == 0).all()


def dataclass_replace(batch, **changes):
    import dataclasses

    return dataclasses.replace(batch, **changes)


def test_collected_multi_turn_episodes_record_the_version_of_every_turn():
    from gym_llm_adapters.episodes import EpisodeBuilder
    from gym_llm_adapters.types import Completion

    builder = EpisodeBuilder(0, 5, 1, 0, np.array([1, 2, 3]))
    for version, ids, env_ids in ((2, [10, 11], [20, 21]), (3, [12, 13, 14], [])):
        builder.add_step(Completion(prompt_ids=builder.token_ids.copy(), token_ids=np.array(ids),
                                    logprobs=np.full(len(ids), -0.5, np.float32), text="", finish_reason="stop",
                                    version=version), reward=0.0, terminated=not env_ids, truncated=False, info={})
        if env_ids:
            builder.observe(np.r_[builder.token_ids, env_ids])
    trajectory = builder.finish(None, None)
    assert trajectory.turn_tokens == [2, 3]
    assert trajectory.token_versions().tolist() == [-1, -1, -1, 2, 2, -1, -1, 3, 3, 3]
    batch = RolloutBatch.from_trajectories([trajectory])
    assert batch.token_versions[0].tolist() == [-1, -1, -1, 2, 2, -1, -1, 3, 3, 3]
    # and the rollout file keeps it (checksummed)
    from gym_llm_adapters.rollout_io import record_from_dict, record_to_dict

    again = record_from_dict(json.loads(json.dumps(record_to_dict(trajectory))))
    assert again.turn_tokens == [2, 3]
    tampered = record_to_dict(trajectory)
    tampered["turn_tokens"] = [3, 2]
    with pytest.raises(ValueError, match="checksum"):
        record_from_dict(tampered)


def test_mask_truncated_completions_leaves_cut_episodes_out():
    batch, current = _batch([[0, 4, 4, 4, 4, 4]] * 2, truncated=(False, True))
    loss = GRPOLoss(GRPOLossConfig(mask_truncated=True))
    assert loss.counted_tokens(batch) == 5
    out = loss.from_batch(current, batch, num_items=5)
    grad = torch.autograd.grad(out.loss, current)[0]
    assert (grad[1] == 0).all() and torch.allclose(grad[0, 1:], torch.full((5,), -1.0 / 5))
    kept = GRPOLoss(GRPOLossConfig()).from_batch(current, batch)
    assert (torch.autograd.grad(kept.loss, current)[0][1, 1:] != 0).all()


def test_dr_grpo_constant_is_the_episode_budget(tmp_path):
    """The trainer's Dr. GRPO constant covers every turn of an episode (max_turns x max_new_tokens, capped by
    max_seq_len), not one turn."""
    import gymnasium as gym

    import gym_llm  # noqa: F401
    from gym_llm_adapters.training.trainer import Trainer

    class Probe:  # only what _episode_token_budget reads
        def __init__(self, envs, max_new_tokens, max_seq_len):
            self.envs = envs
            self.config = type("C", (), {"max_new_tokens": max_new_tokens, "max_seq_len": max_seq_len})

    envs = gym.make_vec("LLMPythonTool-v0", num_envs=2, vectorization_mode="vector_entry_point", max_turns=4,
                        source="arithmetic")
    try:
        assert Trainer._episode_token_budget(Probe(envs, 64, 4096)) == 256
        assert Trainer._episode_token_budget(Probe(envs, 64, 200)) == 200
    finally:
        envs.close()
    single = gym.make_vec("LLMGSM8K-v0", num_envs=2, vectorization_mode="vector_entry_point", source="arithmetic")
    assert Trainer._episode_token_budget(Probe(single, 64, 4096)) == 64
    single.close()


if __name__ == "__main__":
    import sys

    print(json.dumps(vllm_checks(sys.argv[1])))
