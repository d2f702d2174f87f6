"""Validation of actions, shared by every env: bad input raises and names the fix."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

__all__ = ["check_text_action", "check_token_action"]


def check_text_action(action: Any, max_chars: int) -> str:
    """``action`` as a str of at most ``max_chars`` characters, else ``TypeError``/``ValueError``."""
    if type(action) is str and len(action) <= max_chars:  # the common case, checked once per sample
        return action
    if not isinstance(action, str):
        hint = "decode bytes to str first" if isinstance(action, (bytes, bytearray)) else (
            "this env is in text mode; pass the reply as a str (or make the env with mode='tokens')"
        )
        raise TypeError(f"Expected the action as a str, got {type(action).__name__}; {hint}.")
    if len(action) > max_chars:
        raise ValueError(
            f"The action has {len(action)} characters; at most {max_chars} are accepted. Cap the "
            "generation length, or raise the env's character limit (max_action_chars / max_chars)."
        )
    return str(action)


def check_token_action(action: Any, vocab_size: int, max_tokens: int) -> np.ndarray:
    """The action's token ids as a 1-D int64 array.

    Accepts a 1-D int array/list, or ``{"input_ids": (L,), "attention_mask": (L,)}`` whose ids are
    ``input_ids[attention_mask == 1]``. Raises ``TypeError``/``ValueError`` naming the problem: text
    instead of ids, wrong shape or dtype, more than ``max_tokens`` ids, ids outside ``[0, vocab_size)``.
    """
    if isinstance(action, Mapping):
        if set(action) != {"input_ids", "attention_mask"}:
            raise ValueError(
                f"A token action dict needs exactly 'input_ids' and 'attention_mask', got {sorted(action)}."
            )
        ids, mask = np.asarray(action["input_ids"]), np.asarray(action["attention_mask"])
        if ids.shape != mask.shape or ids.ndim != 1:
            raise ValueError(
                f"input_ids and attention_mask must be 1-D of equal length, got shapes {ids.shape} and {mask.shape}."
            )
        if mask.size and not np.isin(mask, (0, 1)).all():
            raise ValueError("attention_mask must hold only 0 and 1.")
        ids = ids[mask.astype(bool)]
    elif isinstance(action, (str, bytes)):
        raise TypeError(
            "This env is in tokens mode: pass the sampled token ids (a 1-D int array or list, or "
            "{'input_ids', 'attention_mask'}), not text."
        )
    else:
        if isinstance(action, (list, tuple)) and any(isinstance(a, (bool, np.bool_)) for a in action):
            raise TypeError("Token ids must be ints; got a bool among them (True/False would pass as 1/0).")
        try:
            ids = np.asarray(action)
        except Exception as e:  # ragged nested lists and other odd objects
            raise TypeError(f"Expected a 1-D sequence of token ids, got {type(action).__name__}: {e}") from e
    if ids.ndim != 1:
        raise ValueError(f"Expected a 1-D sequence of token ids, got an array of shape {ids.shape}.")
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"Token ids must be integers, got dtype {ids.dtype}.")
    if len(ids) > max_tokens:
        raise ValueError(
            f"The action has {len(ids)} tokens; at most {max_tokens} are accepted. Set the engine's "
            "max_tokens to at most that, or raise the env's max_action_tokens."
        )
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(
            f"Token id {bad} is outside the vocabulary [0, {vocab_size}). If the model's vocabulary is "
            "larger than the tokenizer's, pass vocab_size= (the model's embedding size)."
        )
    return ids.astype(np.int64, copy=False)
