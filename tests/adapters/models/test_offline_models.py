"""Offline tokenizers and tiny checkpoints: what the engines load equals what the envs use."""

from __future__ import annotations

import random

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
