"""The docstring examples of the KL and loss modules run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["gym_llm_adapters.kl", "gym_llm_adapters.losses.advantages", "gym_llm_adapters.losses.selection"]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
