"""Reward functions and verifiers (pure functions of text; no env state)."""
