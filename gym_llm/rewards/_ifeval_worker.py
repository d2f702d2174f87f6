"""Imported by each IFEval deadline worker when it starts (``WorkerPool(preload=...)``): the checkers' one-time set-up
(imports, ``punkt_tab``, seeded ``langdetect``) happens there, before any scoring deadline runs."""

from gym_llm.rewards.ifeval import prepare

prepare()
