"""Tuning tables this plugin ships (docs/tuning.md), found through the
``opcore.tuning_tables`` entry point ``cuda``: every ``*.json`` file here is a table written by
``opcore tune`` on the device it names (its ``environment``). A table applies only where the
device, capability, torch and Triton versions and the providers' identities all match;
elsewhere it is ignored with one warning, and the providers use their own heuristics.
"""
