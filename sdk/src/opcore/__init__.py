"""opcore: operator semantics once, kernels per platform.

``PLUGIN_API_VERSION`` is the version of the contract between the core and platform
plugins (the `Platform` interface, entry-point groups, hooks). A platform class declares the
range it was written for in ``Platform.plugin_api``; what changed between major versions
is in `opcore.platforms.api_version`.
"""

__version__ = "2.0.0"  # its major is PLUGIN_API_VERSION's (opcore.version_policy)
PLUGIN_API_VERSION = "2.0"

__all__ = ["PLUGIN_API_VERSION", "__version__"]
