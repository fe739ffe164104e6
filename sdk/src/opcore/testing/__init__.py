"""Helpers for testing opcore and its plugins (importable by plugin test suites)."""

from opcore.testing.distributions import make_distribution, run_python

__all__ = ["make_distribution", "run_python"]
