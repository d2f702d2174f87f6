"""The registered environments (import a module to use its classes directly)."""
