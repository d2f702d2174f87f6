"""Adapters to other RL libraries that need no torch (each imports its peer's package; import the submodule)."""
