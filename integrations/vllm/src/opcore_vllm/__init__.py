"""opcore inside vLLM: vLLM loads `register` through its ``vllm.general_plugins`` entry
point in each of its processes (``vllm.plugins.load_general_plugins``).

`register` never changes what vLLM runs by itself:

- it registers opcore's providers as vLLM IR providers ``opcore_<provider>`` for every op
  both sides define (`opcore_vllm._ir`); vLLM dispatches to them only when its own
  ``ir_op_priority`` names them (``--ir-op-priority``, ``KernelConfig.ir_op_priority``);
- it registers opcore's layers through ``CustomOp.register_oot`` only when
  ``OPCORE_VLLM_LAYERS`` names them, and only when vLLM's class has the signature the
  adapter was written for (`opcore_vllm._layers`);
- an adapter that does not fit refuses with one line (logged on ``opcore_vllm``, listed in
  `report` and in ``opcore info --json``'s ``vllm`` section), and vLLM runs as if it were
  absent.

``OPCORE_VLLM_PRIORITY`` (``opcore_native`` or ``opcore_triton,opcore_native``; plain
opcore names get the prefix) is turned into vLLM's ``ir_op_priority`` by `ir_op_priority`,
for ``LLM(..., ir_op_priority=opcore_vllm.ir_op_priority())`` or
``--ir-op-priority "$(python -m opcore_vllm ir-op-priority)"``; vLLM's config stays the
only place that decides.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

__version__ = "0.1.0"

# The vLLM versions the adapters were written for (pyproject's dependency says the same).
VLLM_RANGE = ">=0.33,<0.34"
PRIORITY_VARIABLE = "OPCORE_VLLM_PRIORITY"

logger = logging.getLogger("opcore_vllm")

__all__ = [
    "VLLM_RANGE",
    "Report",
    "build_report",
    "info_section",
    "ir_op_priority",
    "register",
    "report",
]


@dataclasses.dataclass
class Report:
    """What `register` did in this process."""

    vllm_version: str | None = None
    # op -> the vLLM provider names registered for it
    providers: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    # layer adapter -> "registered (...)" or why it is off
    layers: dict[str, str] = dataclasses.field(default_factory=dict)
    # "ir.<op>" / "layer.<name>" / "bridge" -> one line
    refused: dict[str, str] = dataclasses.field(default_factory=dict)

    def refuse(self, what: str, why: str) -> None:
        line = " ".join(f"{why} (opcore-vllm supports vLLM {VLLM_RANGE})".split())
        self.refused[what] = line
        logger.warning("opcore-vllm: %s refused: %s", what, line)

    def to_dict(self) -> dict[str, Any]:
        return {
            "vllm_version": self.vllm_version,
            "supported_range": VLLM_RANGE,
            "providers": {k: list(v) for k, v in sorted(self.providers.items())},
            "layers": dict(sorted(self.layers.items())),
            "refused": dict(sorted(self.refused.items())),
        }


_REPORT: Report | None = None


def version_fits(version: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return Version(version) in SpecifierSet(VLLM_RANGE)


def register() -> Report:
    """The ``vllm.general_plugins`` entry point: register what fits, once per process (vLLM
    may load its general plugins more than once). Never raises: a failure is one refusal
    line and vLLM runs without the bridge."""
    global _REPORT
    if _REPORT is None:
        _REPORT = build_report()
        if _REPORT.providers:
            logger.info(
                "opcore-vllm: IR providers %s",
                ", ".join(f"{op}: {'/'.join(p)}" for op, p in sorted(_REPORT.providers.items())),
            )
    return _REPORT


def build_report(vllm_version: str | None = None) -> Report:
    """Register what fits vLLM ``vllm_version`` (default: the installed one's) and say
    what was done; outside `VLLM_RANGE` nothing is registered."""
    rep = Report()
    try:
        if vllm_version is None:
            import vllm

            vllm_version = vllm.__version__
        rep.vllm_version = vllm_version
        if not version_fits(vllm_version):
            rep.refuse("bridge", f"vLLM {vllm_version} is outside the range the adapters fit")
            return rep
        from opcore_vllm import _ir, _layers

        _ir.register_ir(rep)
        _layers.register_layers(rep)
    except Exception as exc:  # never break vLLM's start-up
        rep.refuse("bridge", f"{type(exc).__name__}: {exc}")
    return rep


def report() -> Report | None:
    """This process's `Report`, or None before `register` ran."""
    return _REPORT


def ir_op_priority(environ: Any = None) -> dict[str, list[str]]:
    """vLLM's ``ir_op_priority`` from ``OPCORE_VLLM_PRIORITY``: for each op the bridge
    serves, the named opcore providers registered for it, then ``native`` (opcore's
    providers refuse some arguments vLLM takes, which then fall through to vLLM's native).
    Empty when the variable is unset. Runs `register` first."""
    text = (environ if environ is not None else os.environ).get(PRIORITY_VARIABLE, "")
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        return {}
    names = [n if n.startswith("opcore_") else f"opcore_{n}" for n in names]
    rep = register()
    out = {}
    for op, providers in sorted(rep.providers.items()):
        chosen = [n for n in names if n in providers]
        if chosen:
            out[op] = [*chosen, "native"]
    return out


def info_section() -> dict[str, Any] | None:
    """The ``opcore.info_sections`` entry point: ``opcore info``'s ``vllm`` section, or
    None (no section) when vLLM does not import."""
    try:
        import vllm  # noqa: F401
    except Exception:
        return None
    data = register().to_dict()
    data["priority_from_env"] = ir_op_priority()
    return data
