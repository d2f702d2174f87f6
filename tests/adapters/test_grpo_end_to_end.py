"""End to end: tiny model, in-process vLLM engine, GSM8K env with groups, three GRPO steps with weight sync.

Checks that parameters change, the engine version increments and rollouts carry it, and the reference
KL is finite — and zero at step 0 against a reference identical to the policy.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

import gym_llm  # noqa: F401

pytestmark = pytest.mark.slow

GROUP_SIZE = 4


def digit_share(task, messages):
    """A dense shaping reward (share of digits in the reply), so groups have reward variance from step 0."""
    reply = messages[-1].content
    return sum(c.isdigit() for c in reply) / max(1, len(reply))


def test_three_grpo_steps_with_weight_sync(vllm_engine, tiny_model_path, gsm8k_test_file):
    from transformers import AutoModelForCausalLM

    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.engines import SamplingConfig
    from gym_llm_adapters.kl import ReferenceKL
    from gym_llm_adapters.logprobs import token_logprobs
    from gym_llm_adapters.losses import GRPOLoss, GRPOLossConfig, MCAdvantage
    from gym_llm_adapters.types import RolloutBatch
    from gym_llm_adapters.weights import WeightSync

    engine = vllm_engine
    start_version = engine.version
    envs = gym.make_vec("LLMGSM8K-v0", num_envs=8, group_size=GROUP_SIZE, vectorization_mode="vector_entry_point",
                        mode="tokens", tokenizer=engine.tokenizer, data_files=str(gsm8k_test_file),
                        reward_fn=digit_share, max_seq_len=1024, max_action_tokens=16)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    reference = copy.deepcopy(policy)
    policy.train()
    initial = {name: p.detach().clone() for name, p in policy.named_parameters()}
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    collector = Collector(envs, engine, SamplingConfig(max_tokens=16, temperature=1.0), episodes_per_batch=8, seed=0)
    sync = WeightSync(policy, engine)
    ref_kl = ReferenceKL(reference)
    loss_fn = GRPOLoss(GRPOLossConfig(beta=0.04, importance_sampling="token_truncate"))

    versions_seen, kl_means = [], []
    for step in range(3):
        trajectories = collector.next_batch()
        assert len(trajectories) == 8
        groups = {(t.group_id, t.round) for t in trajectories}
        assert len(groups) == 2  # whole groups: 2 tasks x 4 samples
        batch = RolloutBatch.from_trajectories(trajectories, pad_id=engine.tokenizer.pad_token_id)
        versions_seen.append(set(batch.versions.tolist()))
        batch = MCAdvantage()(batch)
        assert np.abs(batch.advantages).sum() > 0  # the shaping reward gives each group variance
        batch = ref_kl.apply(batch)
        kl = ref_kl(batch).kl_per_sequence
        assert torch.isfinite(torch.as_tensor(kl)).all()
        kl_means.append(float(torch.as_tensor(kl).abs().mean()))
        tensors = batch.to_torch()
        logprobs = token_logprobs(policy, tensors["input_ids"], tensors["attention_mask"], tensors["policy_mask"])
        out = loss_fn.from_batch(logprobs, batch)
        assert torch.isfinite(out.loss)
        if step == 0:
            # the policy is the reference: the loss's KL term is zero (up to float rounding)
            assert abs(float(out.kl)) < 1e-5
            # the engine's log-probs equal the trainer's on the sampled tokens (same weights)
            mask = tensors["policy_mask"]
            assert torch.allclose(logprobs[mask], tensors["logprobs"][mask], atol=1e-3)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        assert sync.push() == start_version + step + 1
        assert engine.version == start_version + step + 1

    assert versions_seen == [{start_version}, {start_version + 1}, {start_version + 2}]
    changed = [name for name, p in policy.named_parameters() if not torch.equal(p.detach(), initial[name])]
    assert len(changed) == len(initial)
    # step 0's KL against the identical reference is ~0 (vLLM vs transformers numerics only), later ones grow
    assert kl_means[0] < 1e-3 and kl_means[-1] > kl_means[0]
    envs.close()
