"""Incremental detokenisation: the text of growing token sequences, decoding only the newest tokens.

Decoding a single token alone is wrong in general: a byte-level BPE token may hold half of a UTF-8
character, and SentencePiece decoders drop the leading space of the first token. So each row keeps a
small *window* of recent tokens, starting ``prefix_offset`` (a few tokens of context), and how many
characters of the window's text were already emitted. After each new token::

    window_text = decode(ids[prefix_offset:])
    if not window_text.endswith("\ufffd"):        # the newest token ends on a character boundary
        text += window_text[emitted_chars:];  emitted_chars = len(window_text)
    if len(ids) - prefix_offset > 24:               # keep the window short: restart it on the last 5 tokens
        prefix_offset = len(ids) - 5;  emitted_chars = len(decode(ids[prefix_offset:]))

so a step decodes at most ~25 tokens per row whatever the sequence length (one decode per step, plus
one every ~20 steps to restart the window), and a token that ends in the middle of a character waits
until the character is complete. This is the prefix/read-offset scheme of vLLM and TGI with the
window kept across steps, which halves the decode calls. The accumulated text equals ``decode(ids)``
of the whole sequence (``skip_special_tokens=False``) except while the newest tokens decode to a
trailing run of U+FFFD (an incomplete character, or bytes that are not UTF-8 at all): that tail is
held back until a token ends on a character boundary (at most 64 tokens, then it is emitted). All rows
are decoded in one call to the Rust ``tokenizers`` backend when the tokenizer has one (Hugging Face
fast tokenizers).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from gym_llm.core.tokenizer import TokenizerView

__all__ = ["CONTEXT_TOKENS", "IncrementalDetokenizer"]

CONTEXT_TOKENS = 5
"""Tokens of already-emitted text a window starts with (decoding context for the next token)."""
_WINDOW_TOKENS = 24  # a longer window is restarted on its last CONTEXT_TOKENS tokens
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
        self.prefix_offsets = np.zeros(num_rows, dtype=np.int64)  # first token of the window
        self.read_offsets = np.zeros(num_rows, dtype=np.int64)  # tokens whose text is emitted
        self.emitted_chars = np.zeros(num_rows, dtype=np.int64)  # characters of the window's text emitted

    def decode(self, token_ids: Sequence[int]) -> str:
        """The full text of one sequence."""
        return self._decode_batch([list(token_ids)])[0]

    def prompt_context(self, token_ids: Sequence[int]) -> tuple[int, int]:
        """``(prefix_offset, emitted_chars)`` for a sequence starting as ``token_ids`` (cache it per prompt)."""
        prefix = max(0, len(token_ids) - CONTEXT_TOKENS)
        return prefix, len(self.decode(token_ids[prefix:]))

    def start(self, row: int, length: int, text: str, context: tuple[int, int]) -> None:
        """Row ``row`` now holds ``length`` tokens whose text is ``text`` (``context``: :meth:`prompt_context`)."""
        self.texts[row] = text
        self.prefix_offsets[row], self.emitted_chars[row] = context
        self.read_offsets[row] = length

    def state(self, row: int) -> tuple[str, int, int, int]:
        return (self.texts[row], int(self.prefix_offsets[row]), int(self.read_offsets[row]),
                int(self.emitted_chars[row]))

    def restore(self, row: int, text: str, prefix_offset: int, read_offset: int, emitted_chars: int) -> None:
        self.texts[row] = text
        self.prefix_offsets[row], self.read_offsets[row], self.emitted_chars[row] = prefix_offset, read_offset, emitted_chars

    def advance(self, token_ids: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> None:
        """Update the text of ``rows`` after tokens were appended: ``token_ids`` ``(N, L)`` is the padded
        id buffer and ``lengths`` ``(N,)`` the new lengths."""
        prefix, read, emitted, texts = self.prefix_offsets, self.read_offsets, self.emitted_chars, self.texts
        row_list = rows.tolist()
        decoded = self._decode_batch([token_ids[i, prefix[i]: lengths[i]].tolist() for i in row_list])
        restart = []
        for i, window_text in zip(row_list, decoded):
            n = lengths[i]
            if window_text.endswith("\ufffd") and n - read[i] < _MAX_PENDING_TOKENS:
                continue  # the newest token ends inside a character: wait for the rest
            texts[i] += window_text[emitted[i]:]
            emitted[i] = len(window_text)
            read[i] = n
            if n - prefix[i] > _WINDOW_TOKENS:
                restart.append(i)
        if restart:
            for i in restart:
                prefix[i] = lengths[i] - CONTEXT_TOKENS
            windows = self._decode_batch([token_ids[i, prefix[i]: lengths[i]].tolist() for i in restart])
            for i, window_text in zip(restart, windows):
                emitted[i] = len(window_text)
