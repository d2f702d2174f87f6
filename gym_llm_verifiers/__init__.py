"""The verifiers plugin package of gym-llm: taskset id ``gym_llm_verifiers``.

verifiers (0.4.0) resolves a taskset id to an importable top-level package whose ``__all__`` exports one
``Taskset`` subclass, and optionally the ``Env`` and default ``Harness`` that go with it. This package re-exports
those of :mod:`gym_llm.integrations.verifiers` (where everything is documented), so::

    vf-eval gym_llm_verifiers --env.taskset.env-id LLMGSM8K-v0 -m MODEL

runs any registered gym_llm env under verifiers. Needs ``pip install 'gym-llm[verifiers]'``.
"""

from gym_llm.integrations.verifiers import GymLLMEnv, GymLLMHarness, GymLLMTaskset

__all__ = ["GymLLMEnv", "GymLLMHarness", "GymLLMTaskset"]
