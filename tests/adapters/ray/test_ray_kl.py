"""Reference KL computed by a Ray actor equals the in-process computation, and survives one death of the actor."""

from __future__ import annotations

import functools
import re
import time

import numpy as np
import pytest
import ray
import torch
from ray_test_envs import reference_that_stalls_once
from transformers import AutoModelForCausalLM

from gym_llm_adapters.kl import ReferenceKL, ReferenceKLConfig
from gym_llm_adapters.ray import RemoteReferenceKL
from gym_llm_adapters.types import RolloutBatch

pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster: all Ray tests in one pytest-xdist worker


def rollout_batch(vocab_size: int, seed: int) -> RolloutBatch:
    rng = np.random.default_rng(seed)
    B, S = 5, 24
    lengths = rng.integers(8, S + 1, B)
    input_ids = rng.integers(3, vocab_size, (B, S))
    attention = (np.arange(S)[None] < lengths[:, None]).astype(np.int8)
    policy_mask = attention * (np.arange(S)[None] >= 4)
    return RolloutBatch(input_ids=input_ids * attention, attention_mask=attention, policy_mask=policy_mask.astype(np.int8),
                        logprobs=(-rng.random((B, S)) * policy_mask).astype(np.float32),
                        rewards=rng.random(B).astype(np.float32), group_ids=np.arange(B), task_ids=np.arange(B),
                        rounds=np.zeros(B, dtype=np.int64), versions=np.zeros(B, dtype=np.int64))


def test_remote_reference_kl_equals_the_local_one(ray_cluster, tiny_model_path, tiny_tok):
    config = ReferenceKLConfig(reward_coef=0.1, estimator="k3")
    local = ReferenceKL(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32), config)
    batches = [rollout_batch(len(tiny_tok), seed) for seed in (0, 1)]
    with RemoteReferenceKL(tiny_model_path, config) as remote:
        pending = [remote.submit(b) for b in batches]  # both run while the driver goes on
        scored = [remote.result(p, timeout_s=300) for p in pending]
        terms = remote.compute(batches[0])
        with pytest.raises(TypeError, match="RolloutBatch"):
            remote.submit(batches[0].to_torch())
    for batch, got in zip(batches, scored):
        want = local.apply(batch)
        np.testing.assert_allclose(got.ref_logprobs, want.ref_logprobs, atol=1e-5)
        np.testing.assert_allclose(got.rewards, want.rewards, atol=1e-5)
        assert not np.allclose(got.rewards, batch.rewards)  # the KL penalty was applied
        assert got.input_ids.tolist() == batch.input_ids.tolist()
    want = local(batches[0])
    np.testing.assert_allclose(terms["kl_per_sequence"], want.kl_per_sequence.numpy(), atol=1e-5)


def test_remote_reference_kl_survives_one_death_then_says_it_died(ray_cluster, tiny_model_path, tiny_tok, tmp_path):
    config = ReferenceKLConfig(reward_coef=0.1)
    batch = rollout_batch(len(tiny_tok), seed=2)
    want = ReferenceKL(AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32), config).apply(batch)
    model = functools.partial(reference_that_stalls_once, str(tiny_model_path), str(tmp_path / "stalled"))
    with RemoteReferenceKL(model, config) as remote:
        pending = remote.submit(batch)
        deadline = time.monotonic() + 120
        while not (tmp_path / "stalled").exists():  # until the call is inside the first process's forward
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ray.kill(remote.actor, no_restart=False)  # Ray restarts the actor and retries the call there
        got = remote.result(pending, timeout_s=50)  # well before the stalled forward would have ended
        np.testing.assert_allclose(got.ref_logprobs, want.ref_logprobs, atol=1e-5)
        ray.kill(remote.actor, no_restart=False)  # the one restart is used up
        deadline = time.monotonic() + 60
        while True:  # ray.kill lands asynchronously: calls may still succeed until it has, then must fail
            try:
                remote.apply(batch)
            except RuntimeError as e:
                assert re.search("reference-KL actor died .*max_restarts=1", str(e)), e
                break
            assert time.monotonic() < deadline, "the killed reference-KL actor kept answering"
            time.sleep(0.1)
