"""Spaces for LLM environments.

* :class:`UnicodeText` — a :class:`gymnasium.spaces.Text` that admits *any* Unicode string up to a
  maximum length (Gymnasium's ``Text`` admits only alphanumerics by default).
* :func:`token_space` — padded token ids ``MultiDiscrete([V] * L)`` plus an explicit
  ``attention_mask`` ``MultiBinary(L)``, as a :class:`gymnasium.spaces.Dict`. Padding is never
  inferred from a pad id: pad often equals eos, so only the mask says which positions are real.

Batching works through Gymnasium's own functions: ``batch_space(UnicodeText)`` is a ``Tuple`` of
``UnicodeText`` (so a batch of text observations is a ``tuple[str, ...]``), and a token ``Dict``
batches to a ``Dict`` of ``Box`` arrays of shape ``(B, L)``.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Sequence

import numpy as np
from gymnasium import spaces

__all__ = ["UnicodeText", "token_space", "pack_tokens", "unpack_tokens"]

# Code points that `sample` draws from: printable ASCII, Latin-1/Latin Extended, Greek, Cyrillic,
# CJK and emoji, plus newline and tab. Samples stay valid UTF-8 (no surrogates) and exercise
# multi-byte characters.
_SAMPLE_RANGES = np.array(
    [(0x20, 0x7F), (0xA0, 0x250), (0x370, 0x400), (0x400, 0x500), (0x4E00, 0x4F00), (0x1F600, 0x1F650)],
    dtype=np.int64,
)
_SAMPLE_WEIGHTS = np.array([8.0, 1.0, 0.5, 0.5, 0.5, 0.25])
_SAMPLE_WEIGHTS /= _SAMPLE_WEIGHTS.sum()


class UnicodeText(spaces.Text):
    """A text space of any Unicode string with ``min_length <= len(s) <= max_length``.

    Args:
        max_length: the longest admitted string, in characters (code points).
        min_length: the shortest admitted string (default 0: the empty string is admitted).

    Example:
        >>> space = UnicodeText(max_length=16)
        >>> space.contains("Grüße, 世界! 🙂")
        True
        >>> space.contains("x" * 17)
        False
        >>> space == UnicodeText(16), space == UnicodeText(17)
        (True, False)
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        if not isinstance(max_length, (int, np.integer)) or max_length < 0:
            raise ValueError(f"UnicodeText expected max_length to be an int >= 0, got {max_length!r}.")
        if not isinstance(min_length, (int, np.integer)) or not 0 <= min_length <= max_length:
            raise ValueError(
                f"UnicodeText expected 0 <= min_length <= max_length={max_length}, got min_length={min_length!r}."
            )
        # The parent keeps a charset for its own `sample(mask=...)`; we only use it there.
        super().__init__(max_length=int(max_length), min_length=int(min_length), seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random Unicode string (printable ASCII mostly, with multi-byte characters mixed in).

        ``mask``/``probability`` follow :meth:`gymnasium.spaces.Text.sample` and then sample from the
        parent's alphanumeric charset.
        """
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        rng = self.np_random
        length = int(rng.integers(self.min_length, self.max_length + 1))
        if length == 0:
            return ""
        which = rng.choice(len(_SAMPLE_RANGES), size=length, p=_SAMPLE_WEIGHTS)
        lo, hi = _SAMPLE_RANGES[which, 0], _SAMPLE_RANGES[which, 1]
        code_points = lo + (rng.random(length) * (hi - lo)).astype(np.int64)
        newline = rng.random(length) < 0.02
        code_points[newline] = 0x0A
        return "".join(map(chr, code_points.tolist()))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash((UnicodeText, self.min_length, self.max_length))

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    @property
    def is_np_flattenable(self) -> bool:
        return False


def token_space(vocab_size: int, max_length: int) -> spaces.Dict:
    """The space of padded token sequences: ``{"input_ids": MultiDiscrete([V] * L), "attention_mask": MultiBinary(L)}``.

    ``attention_mask[i] == 1`` marks a real token. Observations produced by the envs are right-padded
    (real tokens first); actions may use any mask: the action's tokens are ``input_ids[attention_mask == 1]``
    in order, so every sample of this space is a valid action.

    Args:
        vocab_size: V, the number of token ids (ids lie in ``[0, V)``).
        max_length: L, the longest sequence.
    """
    if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
        raise ValueError(f"token_space expected vocab_size to be an int >= 1, got {vocab_size!r}.")
    if not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise ValueError(f"token_space expected max_length to be an int >= 1, got {max_length!r}.")
    return spaces.Dict(
        {
            "input_ids": spaces.MultiDiscrete(np.full(int(max_length), int(vocab_size), dtype=np.int64)),
            "attention_mask": spaces.MultiBinary(int(max_length)),
        }
    )


def pack_tokens(token_ids: Sequence[int] | np.ndarray, max_length: int) -> dict[str, np.ndarray]:
    """Right-pad ``token_ids`` to ``max_length``: ``{"input_ids": (L,) int64, "attention_mask": (L,) int8}``.

    Raises ``ValueError`` if there are more than ``max_length`` ids.
    """
    n = len(token_ids)
    if n > max_length:
        raise ValueError(f"pack_tokens got {n} token ids but the space holds at most {max_length}.")
    input_ids = np.zeros(max_length, dtype=np.int64)
    input_ids[:n] = token_ids
    attention_mask = np.zeros(max_length, dtype=np.int8)
    attention_mask[:n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def unpack_tokens(packed: dict[str, np.ndarray]) -> np.ndarray:
    """The real token ids of a packed sequence: ``input_ids[attention_mask == 1]`` (any mask layout)."""
    return np.asarray(packed["input_ids"])[np.asarray(packed["attention_mask"]).astype(bool)]


# --- Flattening and shared memory -------------------------------------------------------------------
# Gymnasium flattens Text through its charset index, which cannot hold arbitrary Unicode, and
# AsyncVectorEnv's shared memory uses that flattening. UnicodeText flattens to UTF-32 code points
# padded with -1 instead, in the same int32 buffer layout, so AsyncVectorEnv(shared_memory=True) works.
from gymnasium.spaces.utils import flatten as _flatten, unflatten as _unflatten  # noqa: E402
from gymnasium.vector.utils.shared_memory import read_from_shared_memory as _read_shared  # noqa: E402


@_flatten.register(UnicodeText)
def _flatten_unicode_text(space: UnicodeText, x: str) -> np.ndarray:
    out = np.full(space.max_length, -1, dtype=np.int32)
    code_points = np.frombuffer(x.encode("utf-32-le"), dtype=np.int32)
    out[: len(code_points)] = code_points
    return out


@_unflatten.register(UnicodeText)
def _unflatten_unicode_text(space: UnicodeText, x: np.ndarray) -> str:
    x = np.asarray(x, dtype=np.int32)
    return x[x >= 0].tobytes().decode("utf-32-le")


class SharedTextBatch(collections.abc.Sequence):
    """The ``n`` strings of a UnicodeText batch in shared memory, decoded when read: a *live* view, like the numpy
    views Gymnasium's AsyncVectorEnv returns for array spaces. AsyncVectorEnv reads its shared buffer once, when it
    is made, and returns that object after every reset and step (a deep copy of it by default): a tuple decoded at
    that moment would repeat the empty buffer forever. A copy (``copy.copy``/``deepcopy``, what ``copy=True`` — the
    default — hands out) is a plain tuple of the current strings."""

    def __init__(self, space: UnicodeText, data: np.ndarray):
        self._space, self._data = space, data  # (n, max_length) int32, a view of the shared buffer

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(_unflatten_unicode_text(self._space, row) for row in self._data[index])
        return _unflatten_unicode_text(self._space, self._data[index])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (tuple, Sequence)) and not isinstance(other, str) and tuple(self) == tuple(other)

    __hash__ = None  # a live view is not hashable

    def __copy__(self) -> tuple[str, ...]:
        return tuple(self)

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return tuple(self)

    def __reduce__(self):
        return tuple, (tuple(self),)

    def __repr__(self) -> str:
        return repr(tuple(self))


@_read_shared.register(UnicodeText)
def _read_unicode_text_from_shared_memory(space: UnicodeText, shared_memory: Any, n: int = 1) -> SharedTextBatch:
    return SharedTextBatch(space, np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape((n, space.max_length)))
