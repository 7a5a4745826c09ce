"""Prefect flows: experiment (and, later, sweep, eor_fit, analyze)."""
