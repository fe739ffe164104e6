"""Layer replacements of this platform (`register_oot`).

`{{ cookiecutter.__class_prefix }}Platform.import_kernels` imports this module when the
platform is current. The decorator makes every ``RMSNorm(...)`` built afterwards a
`{{ cookiecutter.__class_prefix }}RMSNorm`, keyed by the stable op name ``rms_norm``, so the
``custom_ops`` setting (``-rms_norm``) still reaches it. Construction binds ``forward`` to
the replacement's ``forward_oot`` while ``custom_ops`` enables ``rms_norm``, and to
``forward_native`` otherwise. Kernels never go here: they are providers (`providers`), which
``forward_native`` reaches by the platform's priority (plugin API 2.0).
"""

from __future__ import annotations

from opcore.ir import ops
from opcore.layers import RMSNorm


@RMSNorm.register_oot
class {{ cookiecutter.__class_prefix }}RMSNorm(RMSNorm):
    """RMSNorm on {{ cookiecutter.plugin_name }}.

    The example computes what ``forward_native`` does, through the ops (which dispatch to
    this plugin's provider by the platform's priority). Replace a layer only when your
    hardware does more than the op set: a kernel fusing the residual add, the norm and a
    quantization, say. Otherwise delete this module; providers are enough.
    """

    def forward_oot(self, x, residual=None):
        if residual is None:
            return ops.rms_norm(x, self.weight, self.variance_epsilon, self.variance_size_override)
        return ops.fused_add_rms_norm(
            x, residual, self.weight, self.variance_epsilon, self.variance_size_override
        )
