"""Adapters: engines, collector, reference KL, losses, TRL and Ray integration."""
