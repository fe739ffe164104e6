"""What one conformance run is asked to do (the CLI's and the pytest plugin's options)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from opcore_conformance.report.dirs import DEFAULT_BASE
from opcore_conformance.watchdog import DEFAULT_CASE_TIMEOUT_S, parse_bound

DEFAULT_REPORT_DIR = str(DEFAULT_BASE)  # the base of the per-run directories
# The dtypes an op is checked in when it does not say otherwise (docs/design.md#op-semantics).
DEFAULT_DTYPES = ("float32", "float16", "bfloat16")


def parse_list(text: str | None) -> list[str] | None:
    """``"a,b"`` -> ``["a", "b"]``; ``None`` or empty -> ``None`` (no filter)."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    return items or None


def dtype_from_name(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype name (e.g. float32, bfloat16)")
    return value


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass
class Options:
    """``platform``: run on this platform plugin (sets ``OPCORE_PLATFORM``), else the one
    resolution picks. ``ops`` / ``providers`` / ``dtypes`` / ``checks``: filters (``None``
    = all). ``cases``: exact case ids or globs to run (the repro form). ``quick``: the
    generators' quick sample sets (default) instead of the whole grid. ``imports``: modules
    imported before collection, for providers no plugin registers on this platform (e.g.
    ``opcore.kernels.triton`` under ``TRITON_INTERPRET=1`` on the CPU). ``device_index``: the
    platform's device the cases run on (``platform.device(device_index)``). ``expectations``: a
    TOML file, ``"none"`` to ignore the platform's, or ``None`` for the platform's own.
    ``report_dir``: where the reports go, exactly (refused when it holds a report, unless
    ``overwrite``); ``None``: a new directory per run under ``opcore-reports/``
    (`opcore_conformance.report.dirs` states the policy). ``draft_expectations``: the file
    the draft goes to, refused here, before the run, when it exists (unless ``overwrite``),
    is a directory or has no folder (`opcore_conformance.draft.target_problem`)."""

    platform: str | None = None
    ops: list[str] | None = None
    providers: list[str] | None = None
    dtypes: list[str] | None = None
    checks: list[str] | None = None
    cases: list[str] | None = None
    quick: bool = True
    imports: list[str] | None = None
    device_index: int = 0
    report_dir: Path | None = None
    overwrite: bool = False
    expectations: str | None = None
    progress: bool = True
    # --dump DIR: each numerics case that runs writes DIR/<case id>/ (`opcore_conformance.dump`)
    dump: Path | None = None
    # --draft-expectations FILE: xfail entries for this run's failures (`opcore_conformance.draft`)
    draft_expectations: Path | None = None
    # --case-timeout S: the wall-clock bound on each case (`opcore_conformance.watchdog`)
    case_timeout_s: float = DEFAULT_CASE_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.report_dir is not None:
            self.report_dir = Path(self.report_dir)
        if self.dump is not None:
            self.dump = Path(self.dump)
        if self.draft_expectations is not None:
            from opcore_conformance.draft import target_problem

            self.draft_expectations = Path(self.draft_expectations)
            problem = target_problem(self.draft_expectations, overwrite=self.overwrite)
            if problem is not None:
                raise ValueError(problem)
        for name in self.dtypes or ():
            dtype_from_name(name)
        if (
            isinstance(self.device_index, bool)
            or not isinstance(self.device_index, int)
            or self.device_index < 0
        ):
            raise ValueError(f"device index {self.device_index!r}: expected an int >= 0")
        self.case_timeout_s = parse_bound(self.case_timeout_s, "case_timeout_s")

    @property
    def mode(self) -> str:
        return "quick" if self.quick else "full"
