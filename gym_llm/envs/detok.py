"""Incremental detokenisation: the text of growing token sequences, decoding only the newest tokens.

Decoding a single token alone is wrong in general: a byte-level BPE token may hold half of a UTF-8
character, and SentencePiece decoders drop the leading space of the first token. The standard fix
(used by vLLM and TGI) keeps two offsets per sequence: ``prefix_offset`` (a few tokens of context
already emitted) and ``read_offset`` (where unemitted tokens start). After each new token::

    prefix_text = decode(ids[prefix_offset:read_offset])
    new_text    = decode(ids[prefix_offset:])
    if len(new_text) > len(prefix_text) and not new_text.endswith("\\ufffd"):
        text += new_text[len(prefix_text):];  prefix_offset, read_offset = read_offset, len(ids)

so each step decodes a window of a few tokens, whatever the sequence length, and a token that ends
in the middle of a character waits until the character is complete. The accumulated text equals
``decode(ids)`` of the whole sequence (``skip_special_tokens=False``) except while the newest tokens
decode to a trailing run of U+FFFD (an incomplete character, or bytes that are not UTF-8 at all): that
tail is held back until a token ends on a character boundary (at most 64 tokens, then it is emitted). All rows of a batch are decoded in one call to the Rust
``tokenizers`` backend when the tokenizer has one (Hugging Face fast tokenizers).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from gym_llm.core.tokenizer import TokenizerView

__all__ = ["IncrementalDetokenizer", "PROMPT_CONTEXT_TOKENS"]

PROMPT_CONTEXT_TOKENS = 5
"""Tokens of the prompt kept as decoding context for the first generated token."""
_MAX_PENDING_TOKENS = 64  # a longer run of incomplete characters is emitted as is (U+FFFD)


def _batch_decoder(tokenizer: Any) -> Callable[[list[list[int]]], list[str]]:
    view = TokenizerView(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "decode_batch") and not getattr(
        tokenizer, "clean_up_tokenization_spaces", False
    ):
        return lambda seqs: backend.decode_batch(seqs, skip_special_tokens=False)
    return lambda seqs: [view.decode(s, skip_special_tokens=False) for s in seqs]


class IncrementalDetokenizer:
    """Per-row text of ``num_rows`` token sequences that grow one token at a time.

    Args:
        tokenizer: any tokenizer with ``decode`` (a Hugging Face fast tokenizer decodes in one batch call).
        num_rows: N, the number of sequences.

    Attributes:
        texts: the current text of each row.
    """

    def __init__(self, tokenizer: Any, num_rows: int):
        self._decode_batch = _batch_decoder(tokenizer)
        self.texts: list[str] = [""] * num_rows
        self.prefix_offsets = np.zeros(num_rows, dtype=np.int64)
        self.read_offsets = np.zeros(num_rows, dtype=np.int64)

    def decode(self, token_ids: Sequence[int]) -> str:
        """The full text of one sequence (used once per prompt)."""
        return self._decode_batch([list(token_ids)])[0]

    def start(self, row: int, length: int, text: str) -> None:
        """Row ``row`` now holds ``length`` tokens whose text is ``text``."""
        self.texts[row] = text
        self.prefix_offsets[row] = max(0, length - PROMPT_CONTEXT_TOKENS)
        self.read_offsets[row] = length

    def state(self, row: int) -> tuple[str, int, int]:
        return self.texts[row], int(self.prefix_offsets[row]), int(self.read_offsets[row])

    def restore(self, row: int, text: str, prefix_offset: int, read_offset: int) -> None:
        self.texts[row] = text
        self.prefix_offsets[row] = prefix_offset
        self.read_offsets[row] = read_offset

    def advance(self, token_ids: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> None:
        """Update the text of ``rows`` after tokens were appended: ``token_ids`` ``(N, L)`` is the padded
        id buffer and ``lengths`` ``(N,)`` the new lengths."""
        prefix, read = self.prefix_offsets, self.read_offsets
        windows: list[list[int]] = []
        for i in rows.tolist():
            window = token_ids[i, prefix[i]: lengths[i]].tolist()
            windows.append(window[: read[i] - prefix[i]])
            windows.append(window)
        decoded = self._decode_batch(windows)
        texts = self.texts
        for k, i in enumerate(rows.tolist()):
            before, after = decoded[2 * k], decoded[2 * k + 1]
            pending = lengths[i] - read[i]
            if len(after) > len(before) and (not after.endswith("\ufffd") or pending >= _MAX_PENDING_TOKENS):
                texts[i] += after[len(before):]
                prefix[i] = read[i]
                read[i] = lengths[i]
