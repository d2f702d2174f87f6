"""Offline, ``gym.make("LLMGSM8K-v0")`` with no data fails in seconds (not after the hub client's retries), and its
message names the offline source ``source="arithmetic"`` and ``data_files=``."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest

import gym_llm  # noqa: F401
from gym_llm.tasks.loading import hub_unreachable

UNREACHABLE_HUB = "http://127.0.0.1:9"  # the discard port: refused at once


def test_gsm8k_without_data_fails_fast_offline_naming_the_offline_sources(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE_HUB)
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(flag, raising=False)
    started = time.monotonic()
    with pytest.raises(RuntimeError) as error:
        gym.make("LLMGSM8K-v0")
    assert time.monotonic() - started < 15
    message = str(error.value)
    assert "source='arithmetic'" in message and "data_files=" in message and "cannot be reached" in message
    assert gym.make("LLMGSM8K-v0", source="arithmetic").reset(seed=0)[0]  # the offline source it names works


def test_hub_unreachable(monkeypatch):
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "offline mode" in hub_unreachable()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE_HUB)
    assert UNREACHABLE_HUB in hub_unreachable(timeout_s=1.0)
