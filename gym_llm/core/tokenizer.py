"""A thin, duck-typed view of a tokenizer (no transformers import).

Any object with ``encode(text)`` and ``decode(ids)`` works; ``apply_chat_template`` is used when present.
Hugging Face tokenizers are the common case: they are called with ``add_special_tokens=False`` (the chat
template already writes special tokens such as BOS) and their full length ``len(tokenizer)`` (added
tokens included) is the vocabulary size.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["TokenizerView"]


class TokenizerView:
    """Uniform access to a user's tokenizer.

    Args:
        tokenizer: the tokenizer object (``encode``/``decode`` required).
        vocab_size: V, the number of valid token ids; default ``len(tokenizer)``, else its
            ``vocab_size`` attribute. Pass the model's embedding size when it is larger (padded vocab)
            so every id the model can sample is admitted.
    """

    def __init__(self, tokenizer: Any, vocab_size: int | None = None):
        for method in ("encode", "decode"):
            if not callable(getattr(tokenizer, method, None)):
                raise TypeError(
                    f"The tokenizer must have an `{method}` method (got {type(tokenizer).__name__}); "
                    "pass a Hugging Face tokenizer or an object with encode/decode/apply_chat_template."
                )
        self.tokenizer = tokenizer
        if vocab_size is None:
            try:
                vocab_size = len(tokenizer)
            except TypeError:
                vocab_size = getattr(tokenizer, "vocab_size", None)
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(
                f"Cannot tell the vocabulary size of {type(tokenizer).__name__} (got {vocab_size!r}); pass vocab_size=."
            )
        self.vocab_size = vocab_size
        self._encode_kwargs = _accepts(tokenizer.encode, "x", add_special_tokens=False)
        self._decode_kwargs = _accepts(tokenizer.decode, [0], skip_special_tokens=True)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids: frozenset[int] = frozenset(
            [eos] if isinstance(eos, int) else (eos or [])
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added BOS/EOS (the template writes special tokens itself)."""
        ids = self.tokenizer.encode(text, **self._encode_kwargs)
        return list(ids)

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``; special tokens (EOS, ``<|im_end|>``) are dropped by default."""
        kwargs = self._decode_kwargs if skip_special_tokens else {}
        ids = token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids)
        return self.tokenizer.decode(ids, **kwargs)


def _accepts(method: Any, probe: Any, **kwargs: Any) -> dict[str, Any]:
    """``kwargs`` if ``method(probe, **kwargs)`` works, else ``{}`` (a minimal tokenizer)."""
    try:
        method(probe, **kwargs)
    except TypeError:
        return {}
    except Exception:  # the probe itself may be invalid for this tokenizer; the kwargs are fine
        return kwargs
    return kwargs
