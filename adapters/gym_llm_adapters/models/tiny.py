"""Tiny random-init causal LMs saved as normal checkpoints that vLLM and transformers both load.

The architecture is Qwen2 (2 layers, hidden 128, 2 heads of dim 64 — a head size vLLM's CPU attention
kernel supports), with an untied output head initialised with std 0.3 so sampling is not degenerate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from gym_llm_adapters.models.tokenizers import cache_dir, qwen2_tokenizer, tiny_tokenizer

__all__ = ["tiny_model_dir"]


def tiny_model_dir(
    *,
    tokenizer: Literal["tiny", "qwen2"] = "tiny",
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 256,
    max_position_embeddings: int = 2048,
    head_std: float = 0.3,
    tied: bool = False,
    target: str | Path | None = None,
) -> Path:
    """Build (once; cached by its settings) a tiny Qwen2-architecture checkpoint with its tokenizer.

    Returns the checkpoint folder (``config.json``, ``model.safetensors``, tokenizer files).
    """
    if hidden_size % num_heads or (hidden_size // num_heads) not in (32, 64, 80, 96, 112, 128, 256):
        raise ValueError(
            f"hidden_size/num_heads = {hidden_size}/{num_heads} must be a head size vLLM's CPU kernel supports "
            "(32, 64, 80, 96, 112, 128, 256)."
        )
    name = f"tiny2-{tokenizer}-s{seed}-h{hidden_size}-l{num_layers}-a{num_heads}-kv{num_kv_heads}-i{intermediate_size}-std{head_std}"
    if tied:  # input and output embeddings tied, as in SmolLM2 and Qwen2.5-0.5B
        name += "-tied"
    path = Path(target) if target is not None else cache_dir() / "models" / name
    if (path / "model.safetensors").exists():
        return path
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tiny_tokenizer() if tokenizer == "tiny" else qwen2_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tied,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, head_std)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    from gym_llm_adapters.models.tokenizers import _publish

    path.parent.mkdir(parents=True, exist_ok=True)
    _publish(tmp, path)
    return path
