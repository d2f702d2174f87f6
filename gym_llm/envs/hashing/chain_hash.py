"""The 64-bit chain hash that identifies a token sequence (``LLMHashing-v0``'s node ids).

Definition (all arithmetic modulo 2**64)::

    mix64(z)   = z ^= z >> 30;  z *= 0xBF58476D1CE4E5B9;  z ^= z >> 27;  z *= 0x94D049BB133111EB;  z ^= z >> 31
    H(h, t)    = mix64(h XOR ((t + 1) * 0x9E3779B97F4A7C15))
    hash([])   = HASH_SEED = 0x6A09E667F3BCC908            (or a user seed)
    hash(s+[t]) = H(hash(s), t)

``mix64`` is SplitMix64's finaliser (Steele, Lea & Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014; constants from Stafford's "variant 13"), a bijection of 64-bit words with full
avalanche; ``0x9E3779B97F4A7C15`` is 2**64 divided by the golden ratio (odd, so ``t -> (t+1) * phi`` is
injective). Consequences:

* the hash depends only on the exact token chain — not on padding, batch position, or where the prompt
  ends: ``hash(prompt + generated)`` equals the hash of the whole sequence folded token by token;
* siblings never collide: for a fixed parent ``h``, distinct tokens give distinct children (``H(h, .)``
  is injective). Unrelated chains collide with probability ~``2**-64`` per pair (not cryptographic:
  do not use it against adversaries);
* it is deterministic across processes and machines (unlike Python's salted ``hash()``).

Hashes are ``numpy.uint64``; :func:`chain_hash` returns a Python ``int`` in ``[0, 2**64)``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["HASH_SEED", "chain_hash", "chain_hash_batch", "chain_step", "mix64"]

HASH_SEED = 0x6A09E667F3BCC908
"""The hash of the empty sequence (the first 64 bits of SHA-512's initial value: nothing up the sleeve)."""

_MASK = (1 << 64) - 1
_PHI, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_NP_PHI, _NP_M1, _NP_M2 = np.uint64(_PHI), np.uint64(_M1), np.uint64(_M2)
_S30, _S27, _S31, _ONE = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(1)


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a ``uint64`` array (wraps modulo 2**64; works in place on a copy)."""
    z = z ^ (z >> _S30)
    z *= _NP_M1
    z ^= z >> _S27
    z *= _NP_M2
    z ^= z >> _S31
    return z


def chain_step(hashes: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``H(h, t)`` elementwise: ``hashes`` ``(B,)`` uint64, ``tokens`` ``(B,)`` ints >= 0 -> ``(B,)`` uint64."""
    return mix64(hashes ^ ((tokens.astype(np.uint64) + _ONE) * _NP_PHI))


def chain_hash(token_ids: Sequence[int] | np.ndarray, seed: int = HASH_SEED) -> int:
    """The hash of one token sequence (pure Python ints; same value as the numpy versions).

    Example:
        >>> chain_hash([1, 2, 3]) == chain_hash([3], seed=chain_hash([1, 2]))
        True
        >>> chain_hash([]) == HASH_SEED
        True
    """
    h = int(seed) & _MASK
    for t in (token_ids.tolist() if isinstance(token_ids, np.ndarray) else token_ids):
        z = h ^ (((int(t) + 1) * _PHI) & _MASK)
        z ^= z >> 30
        z = (z * _M1) & _MASK
        z ^= z >> 27
        z = (z * _M2) & _MASK
        h = z ^ (z >> 31)
    return h


def chain_hash_batch(token_ids: np.ndarray, lengths: np.ndarray, seed: int = HASH_SEED) -> np.ndarray:
    """Hashes of ``B`` right-padded sequences: ``token_ids`` ``(B, L)``, ``lengths`` ``(B,)`` -> ``(B,)`` uint64.

    Vectorised over the batch (one :func:`chain_step` per position); padding after ``lengths[b]``
    never enters row ``b``'s hash.
    """
    token_ids = np.asarray(token_ids)
    lengths = np.asarray(lengths)
    if token_ids.ndim != 2 or lengths.shape != token_ids.shape[:1]:
        raise ValueError(f"chain_hash_batch needs token_ids (B, L) and lengths (B,), got {token_ids.shape} and {lengths.shape}.")
    hashes = np.full(token_ids.shape[0], int(seed) & _MASK, dtype=np.uint64)
    for position in range(int(lengths.max(initial=0))):
        live = lengths > position
        hashes = np.where(live, chain_step(hashes, token_ids[:, position]), hashes)
    return hashes
