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

**Byte-level tokenizers** (GPT-2, Qwen, Llama-3: a Hugging Face fast tokenizer whose decoder is ``ByteLevel``)
take a faster, exact path instead. Their decoding is, by definition, "map each token to its bytes, concatenate,
decode as UTF-8 with replacement" (a token whose characters are not all in the byte alphabet, such as an added
special token, stands for its own UTF-8 bytes). So each token's bytes are looked up once in a table
(:func:`byte_level_table`) and fed to a per-row incremental UTF-8 decoder: a step costs a table lookup and
a few bytes of decoding per row, whatever the window, and only an incomplete final character (at most 3
bytes) is held back. The text then equals ``decode(ids)`` of the whole sequence minus that pending tail —
checked against the tokenizer's own ``decode`` in the tests for random token sequences, specials included.
"""

from __future__ import annotations

import codecs
from typing import Any, Callable, Sequence

import numpy as np

from gym_llm.core.tokenizer import TokenizerView

__all__ = ["CONTEXT_TOKENS", "IncrementalDetokenizer", "byte_level_table"]

CONTEXT_TOKENS = 5
"""Tokens of already-emitted text a window starts with (decoding context for the next token)."""
_WINDOW_TOKENS = 24  # a longer window is restarted on its last CONTEXT_TOKENS tokens
_MAX_PENDING_TOKENS = 64  # a longer run of incomplete characters is emitted as is (U+FFFD)


def _byte_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: the printable character that stands for each of the 256 bytes. Printable
    Latin-1 bytes stand for themselves; the other 68 map, in byte order, to U+0100 onwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    chars = {b: chr(b) for b in printable}
    for offset, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + offset)
    return {c: b for b, c in chars.items()}


_BYTE_OF = _byte_alphabet()
_TABLES: dict[int, tuple[Any, list[bytes]]] = {}


def byte_level_table(tokenizer: Any) -> list[bytes] | None:
    """``table[id]``: the bytes token ``id`` decodes to, for a Hugging Face fast tokenizer whose decoder is
    ``ByteLevel`` (None for any other tokenizer). ``decode(ids) == b"".join(table[i] for i in ids).decode(
    "utf-8", "replace")`` with ``skip_special_tokens=False``. Built once per tokenizer (~0.2 s for 150k ids)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    try:
        from tokenizers import decoders
    except ImportError:
        return None
    if not isinstance(getattr(backend, "decoder", None), decoders.ByteLevel):
        return None
    cached = _TABLES.get(id(backend))
    if cached is not None and cached[0] is backend:
        return cached[1]
    vocab = backend.get_vocab(with_added_tokens=True)
    table = [b""] * (max(vocab.values()) + 1)
    byte_of = _BYTE_OF
    for token, index in vocab.items():
        try:
            table[index] = bytes([byte_of[c] for c in token])
        except KeyError:  # not in the byte alphabet (an added token): its own UTF-8 bytes, as the decoder does
            table[index] = token.encode("utf-8")
    if len(_TABLES) >= 8:
        _TABLES.clear()
    _TABLES[id(backend)] = (backend, table)
    return table


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
        self._table = byte_level_table(tokenizer)
        if self._table is not None:  # byte-level: one incremental UTF-8 decoder per row
            utf8 = codecs.getincrementaldecoder("utf-8")
            self._utf8 = [utf8("replace") for _ in range(num_rows)]
            self._new_decoder = lambda: utf8("replace")
        self.prefix_offsets = np.zeros(num_rows, dtype=np.int64)  # first token of the window
        self.read_offsets = np.zeros(num_rows, dtype=np.int64)  # tokens whose text is emitted
        self.emitted_chars = np.zeros(num_rows, dtype=np.int64)  # characters of the window's text emitted

    @property
    def byte_level(self) -> bool:
        """Whether the exact byte-level path is used (see the module docstring)."""
        return self._table is not None

    def decode(self, token_ids: Sequence[int]) -> str:
        """The full text of one sequence."""
        return self._decode_batch([list(token_ids)])[0]

    def prompt(self, token_ids: Sequence[int]) -> tuple[str, Any]:
        """``(text, context)`` of a sequence starting as ``token_ids``, for :meth:`start` (cache it per prompt):
        the text emitted so far and the decoder state that continues it."""
        if self._table is not None:
            decoder = self._new_decoder()
            text = decoder.decode(b"".join([self._table[i] for i in token_ids]))
            return text, decoder.getstate()
        prefix = max(0, len(token_ids) - CONTEXT_TOKENS)
        return self.decode(token_ids), (prefix, len(self.decode(token_ids[prefix:])))

    def start(self, row: int, length: int, text: str, context: Any) -> None:
        """Row ``row`` now holds ``length`` tokens whose text is ``text`` (``context``: from :meth:`prompt`)."""
        self.texts[row] = text
        self.read_offsets[row] = length
        if self._table is not None:
            self._utf8[row].setstate(context)
        else:
            self.prefix_offsets[row], self.emitted_chars[row] = context

    def state(self, row: int) -> tuple:
        """A row's text and decoder state (``(text, read_offset, pending_bytes, flag)`` byte-level, else ``(text,
        prefix_offset, read_offset, emitted_chars)``), for :meth:`restore`."""
        if self._table is not None:
            return (self.texts[row], int(self.read_offsets[row]), *self._utf8[row].getstate())
        return (self.texts[row], int(self.prefix_offsets[row]), int(self.read_offsets[row]),
                int(self.emitted_chars[row]))

    def restore(self, row: int, text: str, *context: Any) -> None:
        self.texts[row] = text
        if self._table is not None:
            self.read_offsets[row] = context[0]
            self._utf8[row].setstate(tuple(context[1:]))
        else:
            self.prefix_offsets[row], self.read_offsets[row], self.emitted_chars[row] = context

    def advance(self, token_ids: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> None:
        """Update the text of ``rows`` after tokens were appended: ``token_ids`` ``(N, L)`` is the padded
        id buffer and ``lengths`` ``(N,)`` the new lengths."""
        texts = self.texts
        row_list = rows.tolist()
        read = self.read_offsets
        if self._table is not None:  # each new token's bytes, through the row's UTF-8 decoder
            table, utf8 = self._table, self._utf8
            if (lengths[rows] - read[rows] == 1).all():  # the usual step: one token per row
                for i, token in zip(row_list, token_ids[rows, lengths[rows] - 1].tolist()):
                    texts[i] += utf8[i].decode(table[token])
            else:
                for i in row_list:
                    new = token_ids[i, read[i]: lengths[i]].tolist()
                    texts[i] += utf8[i].decode(b"".join([table[t] for t in new]))
            read[rows] = lengths[rows]
            return
        prefix, emitted = self.prefix_offsets, self.emitted_chars
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
