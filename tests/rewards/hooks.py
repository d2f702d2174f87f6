"""Reward hooks importable by name, for deadline workers (tests/rewards/test_reward_deadlines.py)."""

from __future__ import annotations

import time

import numpy as np


def chat_reward(task, messages):
    """len(messages); never returns when the last reply says HANG."""
    while "HANG" in messages[-1].content:
        time.sleep(1)
    return float(len(messages))


def sequence_reward(task, sequence, done):
    """The sequence length; never returns when the sequence holds token 7."""
    while 7 in np.asarray(sequence).tolist():
        time.sleep(1)
    return float(len(sequence))


def hashing_reward(task, ids, prompt_length):
    """Tokens generated; never returns when they hold token 7."""
    while 7 in np.asarray(ids)[prompt_length:].tolist():
        time.sleep(1)
    return float(len(ids) - prompt_length)
