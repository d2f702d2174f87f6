"""FSDP2 sharding (gym_llm_adapters.training.fsdp) on 2 gloo ranks against one process doing the same by hand: the
summed gradients with uneven micro-batch counts (one rank padded), tied embeddings kept one tensor, the whole state
dict, and AdamW's moments gathered whole and cut back to shards unchanged. The trainer's use of it (GRPO steps,
checkpoints, resume) is tests/adapters/training/test_data_parallel.py."""

from __future__ import annotations

import pytest
import torch

from gym_llm_adapters.logprobs import token_logprobs
from gym_llm_adapters.training.fsdp import decoder_layers
from tests.adapters.training.fsdp_case import batch, build_model, loss_of
from tests.adapters.training.test_data_parallel import _torchrun


@pytest.mark.slow
def test_sharded_gradients_weights_and_moments_equal_one_process(tmp_path):
    done = _torchrun("-m", "tests.adapters.training.fsdp_grads", str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank-{r}.pt") for r in range(2)]
    assert [r["parameter_type"] for r in ranks] == ["DTensor", "DTensor"]
    assert all(r["tied"] for r in ranks)  # the tied head gathered once: one tensor under both names

    model = build_model()  # one process, the whole batch, one backward
    ids, mask, score = batch()
    loss_of(token_logprobs(model, ids, mask, score), score).backward()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    for name, p in model.named_parameters():
        for r in ranks:  # the reduce-scatter sums (not averages) the ranks' gradients; the padding adds exactly 0
            torch.testing.assert_close(r["grads"][name], p.grad, rtol=1e-5, atol=1e-7, msg=name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    optimizer.step()
    whole = model.state_dict()
    for r in ranks:
        assert r["state"].keys() == whole.keys()
        # AdamW moves an element by about lr whatever its gradient's size, so one whose gradient is rounding noise
        # (two summation orders) may move differently: none by more than lr, and few at all (test_data_parallel.py)
        diffs = torch.cat([(r["state"][name] - value).abs().reshape(-1) for name, value in whole.items()])
        assert float(diffs.max()) <= 1e-2 and float((diffs > 1e-6).float().mean()) <= 1e-2, \
            (float(diffs.max()), float((diffs > 1e-6).float().mean()))
        one = optimizer.state_dict()["state"]
        assert r["moments"]["state"].keys() == one.keys()
        for index, entry in one.items():  # keyed by parameter index, whole tensors: a one-process checkpoint's format
            torch.testing.assert_close(r["moments"]["state"][index]["exp_avg"], entry["exp_avg"], rtol=1e-4,
                                       atol=1e-9)  # 0.1 x the gradient: as close as the gradients
            for key, value in r["moments"]["state"][index].items():
                assert torch.equal(r["reloaded"]["state"][index][key], value), (index, key)


def test_decoder_layers_finds_the_blocks_and_refuses_a_model_without_them():
    model = build_model()
    assert decoder_layers(model) == list(model.model.layers)
    with pytest.raises(ValueError, match="--sharding ddp"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_sharding_is_fsdp2_for_a_full_fine_tune_and_ddp_for_lora_and_fsdp_with_lora_is_refused(tmp_path):
    from gym_llm_adapters.training import TrainConfig
    from gym_llm_adapters.training.distributed import sharding_strategy

    def config(**kw):
        return TrainConfig(algorithm="grpo", env_id="LLMChat-v0", model="tiny", out_dir=tmp_path, engine="hf", **kw)

    assert sharding_strategy(config()) == "fsdp"
    assert sharding_strategy(config(lora_rank=4)) == "ddp"
    assert sharding_strategy(config(sharding="ddp")) == "ddp"
    with pytest.raises(ValueError, match="--sharding ddp or auto with --lora-rank"):
        config(sharding="fsdp", lora_rank=4)
    with pytest.raises(ValueError, match="sharding must be 'auto', 'ddp' or 'fsdp'"):
        config(sharding="zero3")


def test_auto_keeps_whole_replicas_for_a_model_without_decoder_layers_and_fsdp_refuses_it():
    from types import SimpleNamespace

    from gym_llm_adapters.training.fsdp import shard_for_run

    dp = SimpleNamespace(strategy="fsdp", world=2)
    assert shard_for_run(torch.nn.Linear(2, 2), dp, sharding="auto", device="cpu") is None
    assert dp.strategy == "ddp"  # the trainer then all-reduces whole gradients
    with pytest.raises(ValueError, match="no list of decoder layers"):
        shard_for_run(torch.nn.Linear(2, 2), SimpleNamespace(strategy="fsdp", world=2), sharding="fsdp", device="cpu")
