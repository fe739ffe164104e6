"""opcore-plugin-cpu: the in-tree fallback platform, the host CPU."""

from __future__ import annotations


def probe() -> str:
    """The CPU is always present: this plugin is the fallback when no accelerator
    platform activates (resolution rule 6)."""
    return "opcore_plugin_cpu.platform.CpuPlatform"
