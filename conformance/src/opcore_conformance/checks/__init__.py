"""The checks. Each module exposes ``collect(ctx) -> list[Case]``; cases carry their
bodies. Order here is the order of the run and of the reports."""

from __future__ import annotations

from opcore_conformance.checks import (
    attention,
    attention_properties,
    compile,
    determinism,
    fake,
    functional,
    layers,
    numerics,
    platform_contract,
    properties,
)

# (module, the check names its cases use)
CHECK_MODULES = (
    (platform_contract, ("platform",)),
    (numerics, ("numerics",)),
    (functional, ("functional", "maybe_inplace")),
    (determinism, ("determinism",)),
    (properties, properties.CHECKS),
    (fake, ("supports_args", "opcheck")),
    (layers, ("layers",)),
    (attention, ("attention",)),
    (attention_properties, attention_properties.CHECKS),
    (compile, ("compile",)),
)
CHECK_NAMES = tuple(name for _, names in CHECK_MODULES for name in names)
