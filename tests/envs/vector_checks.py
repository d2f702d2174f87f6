"""Comparing what two vector envs return (observations, Gymnasium info dicts of arrays)."""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Recursive equality of batched observations / infos (dicts, tuples, arrays incl. object arrays)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), f"{path}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray) and a.dtype == object:
        b = np.asarray(b, dtype=object)
        assert a.shape == b.shape, f"{path}: shapes {a.shape} != {b.shape}"
        for i, (x, y) in enumerate(zip(a.tolist() if a.ndim else [a.item()], b.tolist() if b.ndim else [b.item()])):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and np.array_equal(a, b), f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def without(info: dict, *keys: str) -> dict:
    """``info`` without ``keys`` and their ``_key`` masks (also inside ``final_info``)."""
    out = {k: v for k, v in info.items() if k not in keys and k.lstrip("_") not in keys}
    if isinstance(out.get("final_info"), dict):
        out["final_info"] = without(out["final_info"], *keys)
    return out
