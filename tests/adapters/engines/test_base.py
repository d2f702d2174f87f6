"""SamplingConfig validation, weight-argument normalisation and stop-string cutting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gym_llm_adapters.engines import Engine, SamplingConfig, named_tensors
from gym_llm_adapters.engines.base import cut_at_stop
from gym_llm_adapters.engines.checkpoint import CheckpointSpec


@pytest.mark.parametrize("kwargs, match", [
    ({"n": 0}, "n must be an int >= 1"),
    ({"max_tokens": 0}, "max_tokens must be an int >= 1"),
    ({"temperature": -0.1}, "temperature must be >= 0"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_k": -1}, "top_k must be an int >= 0"),
    ({"stop": ("",)}, "stop must be non-empty strings"),
])
def test_sampling_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_sampling_config_normalises_stop_and_ids():
    config = SamplingConfig(stop="###", stop_token_ids=[np.int64(3)], temperature=0)
    assert config.stop == ("###",) and config.stop_token_ids == (3,) and config.greedy
    with pytest.raises(TypeError, match="seed must be an int"):
        SamplingConfig(seed=1.5)


def test_named_tensors_accepts_state_dicts_and_pairs():
    weight = torch.ones(2, requires_grad=True)
    for given in ({"a": weight}, [("a", weight)]):
        (name, tensor), = named_tensors(given)
        assert name == "a" and not tensor.requires_grad
    with pytest.raises(ValueError, match="no tensors"):
        named_tensors({})
    with pytest.raises(TypeError, match=r"\(name, tensor\) pairs"):
        named_tensors([("a", 1.0)])


def test_cut_at_stop_takes_the_earliest_match():
    assert cut_at_stop("ab#c##d", ("##", "#c"), include=False) == ("ab", True)
    assert cut_at_stop("ab#c##d", ("##", "#c"), include=True) == ("ab#c", True)
    assert cut_at_stop("abc", ("x",), include=False) == ("abc", False)


def test_checkpoint_spec_refuses_unknown_names_shapes_and_partial_fused_updates(tiny_model_path):
    spec = CheckpointSpec.from_folder(tiny_model_path)
    q = "model.layers.0.self_attn.q_proj.weight"
    full = [(name, torch.zeros(shape)) for name, shape in spec.shapes.items()]
    assert [n for n, _ in spec.validate(full)] == [n for n, _ in full]
    with pytest.raises(ValueError, match="not in the checkpoint"):
        spec.validate([("model.nope.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="has shape"):
        spec.validate([("lm_head.weight", torch.zeros(2, 2))])
    with pytest.raises(ValueError, match="fused parameter; also send"):
        spec.validate([(q, torch.zeros(spec.shapes[q]))])
    rotary = "model.layers.0.self_attn.rotary_emb.inv_freq"
    assert spec.validate([(rotary, torch.zeros(1))]) == []  # vLLM recomputes these buffers


def test_engines_satisfy_the_protocol(hf_engine):
    assert isinstance(hf_engine, Engine)
