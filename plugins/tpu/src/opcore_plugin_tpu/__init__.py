"""opcore-plugin-tpu: Google TPU, and XLA:CPU when ``PJRT_DEVICE=CPU``, through torch_xla.

Importing this package imports neither torch_xla nor JAX; `probe` decides whether the
platform activates (see `opcore_plugin_tpu.detect`).
"""

from __future__ import annotations

from opcore_plugin_tpu.detect import probe

__all__ = ["probe"]
