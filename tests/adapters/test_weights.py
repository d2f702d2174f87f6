"""WeightSync and policy versions."""

from __future__ import annotations

import pytest
import torch

from gym_llm_adapters.engines import HFEngine
from gym_llm_adapters.weights import WeightSync, strip_wrapper_prefixes


def test_strip_wrapper_prefixes():
    assert strip_wrapper_prefixes("module._orig_mod.model.layers.0.mlp.weight") == "model.layers.0.mlp.weight"
    assert strip_wrapper_prefixes("model.layers.0._checkpoint_wrapped_module.mlp.weight") == "model.layers.0.mlp.weight"
    assert strip_wrapper_prefixes("model.module.weight") == "model.module.weight"  # only a leading DDP prefix


def test_push_to_several_engines_keeps_versions_in_step(tiny_model_path):
    policy = HFEngine(tiny_model_path).model
    engines = [HFEngine(tiny_model_path), HFEngine(tiny_model_path)]
    sync = WeightSync(torch.nn.ModuleDict({"module": policy})["module"], engines, dtype=torch.float32)
    with torch.no_grad():
        policy.model.norm.weight.add_(1.0)
    assert sync.push() == 1 and sync.version == 1 and sync.pushes == 1
    for engine in engines:
        torch.testing.assert_close(engine.model.model.norm.weight, policy.model.norm.weight)
    engines[1].load_weights({"model.norm.weight": policy.model.norm.weight})  # updated behind the sync's back
    with pytest.raises(RuntimeError, match="versions disagree"):
        sync.push()


def test_rename_can_skip_tensors(tiny_model_path):
    policy = HFEngine(tiny_model_path).model
    engine = HFEngine(tiny_model_path)
    sync = WeightSync(policy, engine, rename=lambda n: n if n.startswith("lm_head") else None)
    assert [n for n, _ in sync.named_tensors()] == ["lm_head.weight"]
    with pytest.raises(TypeError, match="torch module"):
        WeightSync(object(), engine)
