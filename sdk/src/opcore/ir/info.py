"""`info`: plain data about every op for `opcore info` (JSON-serializable)."""

from __future__ import annotations

from typing import Any

from opcore.ir.op import all_ops
from opcore.ir.priority import MissingPropertyError
from opcore.platforms.kernels import ensure_kernels_loaded, kernel_load_errors


def info(config: Any = None) -> dict[str, Any]:
    """Per op: its schema, registered providers (supported here, in place, accepts every
    argument, identity hash, declared properties), the providers supported here, the
    effective priority under ``config`` (default: the current config) and why the others
    are left out. An op whose priority cannot be decided has ``error`` (its user list
    names an unknown provider); one that no provider of the config's required properties
    serves has ``missing_properties`` (the `MissingPropertyError` a call of it raises).

    Also ``kernel_load_errors``: failures of the platform's kernel hooks."""
    ensure_kernels_loaded()
    ops: dict[str, Any] = {}
    for name, op in all_ops().items():
        entry: dict[str, Any] = {
            "schema": f"opcore_ir::{name}{op.schema}",
            "allow_inplace": op.allow_inplace,
            "activations": list(op.activations),
            "providers": [
                {
                    "name": impl.provider,
                    "supported": impl.supported,
                    "inplace": impl.inplace,
                    "supports_all_args": impl.supports_all_args,
                    "identity": impl.identity_hash()[:16],
                    "properties": list(impl.properties),
                }
                for impl in op.impls.values()
            ],
            "supported_here": op.supported_providers(),
        }
        try:
            decision = op.decision(config)
        except MissingPropertyError as exc:
            # Not a configuration error: the config is valid and every other op runs;
            # calling this one raises this error (docs/properties.md, Requiring them).
            entry["missing_properties"] = str(exc)
        except ValueError as exc:
            entry["error"] = str(exc)
        else:
            entry["effective_priority"] = decision.names
            entry["user_priority"] = decision.user
            entry["platform_default"] = decision.platform_default
            entry["native_appended"] = decision.native_appended
            entry["skipped"] = decision.skipped
            entry["required_properties"] = decision.required
        ops[name] = entry
    return {"ops": ops, "kernel_load_errors": kernel_load_errors()}
