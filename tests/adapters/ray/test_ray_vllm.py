"""An in-process vLLM engine in a Ray actor behind the Ray collector, with a weight broadcast."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ray_test_envs import SAMPLING, chat_spec, check_complete, check_groups

from gym_llm_adapters.ray import EngineGroup, EngineSpec, RayCollector
from gym_llm_adapters.weights import WeightSync

pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster: all Ray tests in one pytest-xdist worker


@pytest.mark.slow
def test_vllm_engine_actor_collects_and_takes_weights(ray_cluster, tiny_model_path, tiny_tok, hf_engine, fresh_hf_engine):
    spec = EngineSpec("vllm", tiny_model_path, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20)
    with EngineGroup(spec) as group:
        with RayCollector(chat_spec(tiny_tok), group, SAMPLING, num_workers=1, episodes_per_batch=4, seed=0) as collector:
            batch = collector.next_batch()
            check_groups(batch, 2)
            for trajectory in batch:
                check_complete(trajectory, hf_engine)  # vLLM's log-probs == transformers' teacher forcing
            with torch.no_grad():
                fresh_hf_engine.model.lm_head.weight.mul_(1.3)
            assert WeightSync(fresh_hf_engine.model, group).push() == 1  # read-only object-store views into vLLM
            later = collector.collect(2)
        new = [t for b in later for t in b if set(t.versions) == {1}]
        assert new
        for trajectory in new:
            check_complete(trajectory, fresh_hf_engine)
        sequence = new[0].token_ids
        np.testing.assert_allclose(group.logprobs([sequence])[0], fresh_hf_engine.logprobs([sequence])[0], atol=1e-4)
