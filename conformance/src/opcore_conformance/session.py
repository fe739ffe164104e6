"""One conformance run: resolve the platform, collect cases, run them, apply expectations.

The CLI (`opcore_conformance.cli`) and the pytest plugin (`opcore_conformance.pytest_plugin`)
are two front ends over this one object, so both give the same cases, ids, statuses and
reports.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import platform as _pyplatform
import shlex
import sys
import time
import traceback
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from opcore_conformance import expectations as X
from opcore_conformance import status as S
from opcore_conformance.case import (
    Case,
    CheckFailed,
    NotApplicable,
    Outcome,
    Result,
    Unsupported,
    case_id,
)
from opcore_conformance.options import Options
from opcore_conformance.watchdog import DEFAULT_CASE_TIMEOUT_S, timeout_message
from opcore_conformance.wording import near_globs

REPORT_SCHEMA = 1
# Variables outside OPCORE_* that change what a run does, carried by rerun commands.
_RERUN_VARIABLES = ("TRITON_INTERPRET",)


class SetupError(RuntimeError):
    """The run cannot start (no such platform, a platform already resolved differently)."""


def select_platform(name: str | None) -> Any:
    """Resolve the platform, honouring ``name`` by setting ``OPCORE_PLATFORM`` first."""
    import opcore.platforms as P

    if name:
        previous = os.environ.get("OPCORE_PLATFORM")
        if P.is_resolved():  # resolution already happened in this process
            current = P.get_current_platform().name
            if current != name:
                raise SetupError(
                    f"--platform {name}: this process already runs on platform {current!r} "
                    f"(resolved before the conformance run started); run in a fresh process"
                )
        elif previous and previous != name:
            raise SetupError(
                f"--platform {name} conflicts with OPCORE_PLATFORM={previous} in the environment"
            )
        os.environ["OPCORE_PLATFORM"] = name
    try:
        return P.get_current_platform()
    except Exception as exc:
        raise SetupError(f"cannot resolve the platform: {type(exc).__name__}: {exc}") from exc


@dataclasses.dataclass
class Context:
    """What a check body sees: the platform, its device, the options, the seed."""

    options: Options
    platform: Any
    device: torch.device
    seed: int | None
    cache: Any = dataclasses.field(default=None)

    def __post_init__(self) -> None:
        if self.cache is None:
            from opcore_conformance.irapi import SampleCache

            self.cache = SampleCache()

    @property
    def quick(self) -> bool:
        return self.options.quick

    def wants(
        self,
        *,
        op: str | None = None,
        provider: str | None = None,
        dtype: str | None = None,
        check: str | None = None,
    ) -> bool:
        """Whether a case with these parts passes the filters (used to avoid generating
        samples for ops nobody asked for)."""
        o = self.options
        if op is not None and o.ops is not None and op not in o.ops:
            return False
        if provider is not None and o.providers is not None and provider not in o.providers:
            return False
        if dtype is not None and o.dtypes is not None and dtype not in o.dtypes:
            return False
        if check is not None and o.checks is not None and not _check_selected(check, o.checks):
            return False
        return True

    def unfiltered(self, quick: bool) -> Context:
        opts = dataclasses.replace(
            self.options,
            ops=None,
            providers=None,
            dtypes=None,
            checks=None,
            cases=None,
            quick=quick,
        )
        return dataclasses.replace(self, options=opts)


def _check_selected(check: str, selected: Iterable[str]) -> bool:
    # "--checks platform" selects platform.members, platform.dtype, ...
    return any(check == s or check.startswith(s + ".") for s in selected)


def run_body(case: Case, ctx: Context, tolerance) -> Outcome:
    """Run a case body, turning its exceptions into raw statuses."""
    try:
        metrics = case.body(ctx, tolerance) if case.body is not None else None
    except CheckFailed as exc:
        return Outcome(S.FAIL, str(exc), exc.metrics)
    except NotApplicable as exc:
        return Outcome(S.NOT_APPLICABLE, str(exc))
    except Unsupported as exc:
        return Outcome(S.UNSUPPORTED, str(exc))
    except Exception as exc:  # the harness, not the code under test (that is CheckFailed)
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        return Outcome(S.ERROR, f"{type(exc).__name__}: {exc}", {"traceback": "".join(tb[-6:])})
    metrics = dict(metrics or {})
    # a passing check may still have something to say (properties: "could claim")
    return Outcome(S.PASS, str(metrics.pop("message", "")), metrics)


class ConformanceSession:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.ctx: Context | None = None
        self.expectations = X.empty()
        self.expectations_error: str | None = None
        self.meta_cases: list[Case] = []
        self.results: list[Result] = []
        self.started = time.time()
        # The environment as the run found it: setup sets OPCORE_PLATFORM for --platform,
        # and rerun commands must carry what the user had set, not what the run set.
        self.environment = {
            k: v for k, v in os.environ.items() if k.startswith("OPCORE_") or k in _RERUN_VARIABLES
        }
        # Where the reports go (`report.dirs.claim`'s answer), for rerun commands; None
        # when nothing is written (--list).
        self.report_dir: Path | None = None
        self.collected: int | None = None  # how many cases `collect` returned
        # The front end's `opcore_conformance.watchdog.Watchdog`: each body runs under its
        # time bound (None: no bound).
        self.watchdog: Any = None

    # ------------------------------------------------------------------ setup
    def setup(self) -> Context:
        from opcore_conformance import irapi

        # A file named on the command line is read first: a typo or a malformed entry stops
        # the run before the platform, let alone a case, is touched.
        self._load_expectations_file()
        platform = select_platform(self.options.platform)
        irapi.load_kernels(platform)
        for module in self.options.imports or ():
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise SetupError(f"--import {module}: {type(exc).__name__}: {exc}") from exc
        from opcore.platforms.device_check import device_type_problem

        problem = device_type_problem(platform)  # the plugin and what to install or switch on
        if problem is not None:
            raise SetupError(problem)
        index = self.options.device_index
        if index:
            try:
                count = platform.device_count()
            except Exception as exc:
                raise SetupError(
                    f"--device-index {index}: platform {platform.name!r}: device_count() "
                    f"failed: {type(exc).__name__}: {exc}"
                ) from exc
            if index >= count:
                raise SetupError(
                    f"--device-index {index}: platform {platform.name!r} has {count} "
                    f"device(s) (indices 0 to {count - 1})"
                )
        try:
            device = platform.device(index)
        except Exception as exc:  # every case runs there: the run cannot start without it
            raise SetupError(
                f"platform {platform.name!r}: device({index}) failed: {type(exc).__name__}: {exc}"
            ) from exc
        self.ctx = Context(
            options=self.options,
            platform=platform,
            device=device,
            seed=irapi.sample_seed(),
        )
        self._load_expectations(platform)
        return self.ctx

    def _load_expectations_file(self) -> None:
        """``--expectations FILE``: a file that cannot be read or parsed is a usage error."""
        spec = self.options.expectations
        if spec is None or spec.lower() == "none":
            return
        try:
            self.expectations = X.load(spec)
        except X.ExpectationsError as exc:
            raise SetupError(f"--expectations: {exc}") from None

    def _load_expectations(self, platform: Any) -> None:
        """The platform's own file when no --expectations was given. A broken one is the
        plugin's defect, reported as the error case ``expectations[file]``."""
        if self.options.expectations is not None:
            return  # the file (or "none") was read by _load_expectations_file
        try:
            resource = getattr(type(platform), "conformance_expectations", None)
            self.expectations = X.load_resource(resource) if resource else X.empty()
        except X.ExpectationsError as exc:
            self.expectations_error = str(exc)
            self.expectations = X.empty()

    # ------------------------------------------------------------------ collection
    def collect(self) -> list[Case]:
        """The cases of this run, filtered, plus the expectation cases (unmatched entries)."""
        assert self.ctx is not None, "call setup() first"
        self._check_filters()
        from opcore_conformance import fp8

        # fp8 cases on a device that cannot hold fp8 tensors: not_applicable, saying why
        cases = fp8.mark(self.ctx, [c for c in self._collect_all(self.ctx) if self._selected(c)])
        cases += self._expectation_cases()
        seen: set[str] = set()
        for c in cases:
            if c.id in seen:
                raise SetupError(f"duplicate case id {c.id!r}: two checks or samples share a name")
            seen.add(c.id)
        self.collected = len(cases)
        return cases

    def _check_filters(self) -> None:
        """A filter naming nothing that exists is a usage error, not an empty green run."""
        assert self.ctx is not None  # set by setup()
        o = self.options
        if not (o.ops or o.providers or o.dtypes or o.checks):
            return
        from opcore_conformance.checks import CHECK_NAMES

        everything = self._collect_all(self.ctx.unfiltered(quick=True))
        known = {
            "--ops": ({c.op for c in everything if c.op}, o.ops),
            "--providers": ({c.provider for c in everything if c.provider}, o.providers),
            "--dtypes": ({c.dtype for c in everything if c.dtype}, o.dtypes),
        }
        for flag, (names, given) in known.items():
            unknown = [g for g in given or () if g not in names]
            if unknown:
                hint = (
                    " (a provider that no plugin registers here can be loaded with --import MODULE)"
                    if flag == "--providers"
                    else ""
                )
                raise SetupError(
                    f"{flag}: {', '.join(map(repr, unknown))} named by no case on platform "
                    f"{self.ctx.platform.name!r}; known: {', '.join(sorted(names))}{hint}"
                )
        checks = {c.check for c in everything} | set(CHECK_NAMES)
        unknown = [
            g for g in o.checks or () if not any(c == g or c.startswith(g + ".") for c in checks)
        ]
        if unknown:
            raise SetupError(
                f"--checks: {', '.join(map(repr, unknown))} is not a check; known: "
                f"{', '.join(sorted(checks))}"
            )

    def _collect_all(self, ctx: Context) -> list[Case]:
        from opcore_conformance.checks import CHECK_MODULES

        out: list[Case] = []
        for module, names in CHECK_MODULES:
            selected = ctx.options.checks
            if selected is not None and not any(
                _check_selected(n, selected) or s.startswith(n + ".")
                for n in names
                for s in selected
            ):
                continue
            name = names[0]
            try:
                out.extend(module.collect(ctx))
            except Exception as exc:
                msg = f"collecting {name} cases failed: {type(exc).__name__}: {exc}"
                out.append(
                    Case(
                        id=case_id(name, "collect"),
                        check=name,
                        preset=S.ERROR,
                        preset_reason=msg,
                        info={"traceback": traceback.format_exc(), "collect_error": True},
                    )
                )
        return out

    def _selected(self, case: Case) -> bool:
        assert self.ctx is not None  # set by setup()
        o = self.options
        if case.info.get("collect_error"):
            return True  # a check that could not even list its cases is never filtered away
        if o.cases is not None:
            return any(X.compile_glob(p).fullmatch(case.id) for p in o.cases)
        if not self.ctx.wants(op=case.op, provider=case.provider, dtype=case.dtype):
            return False
        if o.checks is not None and not _check_selected(case.check, o.checks):
            return False
        return True

    def inventory(self, modes: tuple[bool, ...] = (True, False)) -> list[str]:
        """Every case id of this platform in the given modes (quick, full), no filters: what
        expectation entries are matched against (an entry for a case this run filtered out
        is fine; one for a case that exists nowhere is an error)."""
        assert self.ctx is not None  # set by setup()
        ids: list[str] = []
        seen: set[str] = set()
        for quick in modes:
            for c in self._collect_all(self.ctx.unfiltered(quick)):
                if c.id not in seen:
                    seen.add(c.id)
                    ids.append(c.id)
        return ids

    def _expectation_cases(self) -> list[Case]:
        assert self.ctx is not None  # set by setup()
        if self.expectations_error:
            return [
                Case(
                    id=case_id("expectations", "file"),
                    check="expectations",
                    preset=S.ERROR,
                    preset_reason=self.expectations_error,
                )
            ]
        if not self.expectations.entries:
            return []
        out = []
        # The quick inventory first; the full grid (slower to generate) only when some
        # entry matched nothing there.
        ids = self.inventory((True,))
        unmatched = self.expectations.unmatched(ids)
        if unmatched:
            ids = self.inventory((True, False))
            unmatched = self.expectations.unmatched(ids)
        for entry in unmatched:
            near = near_globs(entry.match, ids)
            hint = (
                (
                    "; did you mean "
                    + " or ".join(f"{g!r} ({n} case{'s' if n > 1 else ''})" for g, n in near)
                    + "?"
                )
                if near
                else ""
            )
            out.append(
                Case(
                    id=case_id("expectations", f"entry{entry.index}"),
                    check="expectations",
                    preset=S.ERROR,
                    preset_reason=(
                        f"{self.expectations.source}: {entry.label()} matches no case of "
                        f"platform {self.ctx.platform.name!r} (or only cases an earlier "
                        f"entry already takes): remove it or fix the glob{hint}"
                    ),
                )
            )
        return out

    # ------------------------------------------------------------------ running
    def run(self, case: Case) -> Result:
        assert self.ctx is not None
        start = time.perf_counter()
        entry = self.expectations.lookup(case.id) if case.check != "expectations" else None
        result = self._run(case, entry)
        result.duration_s = time.perf_counter() - start
        if entry is not None:
            result.expected = entry.status
            result.expectation_reason = entry.reason
            result.expectation_entry = entry.index
        if S.is_red(result.status):
            result.repro = self.repro(case)
        self.results.append(result)
        return result

    def _run(self, case: Case, entry: X.Entry | None) -> Result:
        assert self.ctx is not None  # set by setup()
        if entry is not None and entry.status in ("skip", "unsupported"):
            status = S.SKIP if entry.status == "skip" else S.UNSUPPORTED
            return Result(case, status, status, f"expectations: {entry.reason}")
        if case.preset is not None:
            status = X.resolve_outcome(case.preset, entry, case.preset_reason)
            return Result(case, status, case.preset, case.preset_reason, dict(case.info))
        tolerance, source = case.default_tolerance, "op"
        if entry is not None and entry.status == "tolerance":
            if case.default_tolerance is None:
                return Result(
                    case,
                    S.ERROR,
                    S.ERROR,
                    f"{entry.label()} loosens the tolerance of a case that has none",
                )
            try:
                tolerance, source = (
                    X.loosened(entry, case.default_tolerance, case.dtype),
                    "expectations",
                )
            except X.ExpectationsError as exc:
                return Result(case, S.ERROR, S.ERROR, str(exc))
        outcome = self._bounded(case, tolerance)
        status = X.resolve_outcome(outcome.status, entry, outcome.message)
        message = outcome.message
        if status == S.XPASS and entry is not None:  # XPASS only comes from an entry
            message = (
                f"passed, but {entry.label()} expects xfail ({entry.reason}): remove the entry"
            )
        return Result(
            case, status, outcome.status, message, outcome.metrics, tolerance_source=source
        )

    def _bounded(self, case: Case, tolerance) -> Outcome:
        """`run_body` under the watchdog's time bound: past it, an error naming the bound."""
        assert self.ctx is not None  # set by setup()
        if self.watchdog is None:
            return run_body(case, self.ctx, tolerance)
        outcome, over = self.watchdog.call(case, run_body, case, self.ctx, tolerance)
        if over is None:
            return outcome
        bound = self.watchdog.bound_s
        message = timeout_message(bound, over, stuck=False)
        return Outcome(S.ERROR, message, {"case_timeout_s": bound})

    def stuck(self, case: Case, elapsed_s: float) -> Result:
        """The result of a case still running past its bound where no exception reaches
        it (the watchdog calls this on its own thread, then ends the run)."""
        bound = self.watchdog.bound_s if self.watchdog is not None else None
        message = timeout_message(bound or 0.0, elapsed_s, stuck=True)
        # As a preset error: the expectations (an xfail entry) apply as to any case.
        info = {**case.info, "case_timeout_s": bound, "stuck": True}
        result = self.run(
            dataclasses.replace(case, preset=S.ERROR, preset_reason=message, info=info)
        )
        result.duration_s = elapsed_s
        return result

    def repro(self, case: Case) -> str:
        """A one-line command that reruns exactly this case, as this run ran it: the
        variables the run found set (every ``OPCORE_*``, so a plugin's stand-in or opt-in
        switch too; ``TRITON_INTERPRET``; the platform's device-visibility variable), the
        platform, imports, mode and expectations file. Its reports go to ``rerun/`` inside
        this run's report directory, replaced by each rerun (``--overwrite``): a rerun
        never touches the run's own reports, and the line works as printed every time."""
        assert self.ctx is not None  # set by setup()
        parts = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.rerun_environment().items())]
        parts += ["opcore", "conformance", "--platform", self.ctx.platform.name]
        for module in self.options.imports or ():
            parts += ["--import", shlex.quote(module)]
        parts += ["--case", shlex.quote(case.id)]
        if self.options.device_index:
            parts += ["--device-index", str(self.options.device_index)]
        if not self.options.quick:
            parts.append("--full")
        if self.options.case_timeout_s != DEFAULT_CASE_TIMEOUT_S:
            parts += ["--case-timeout", f"{self.options.case_timeout_s:g}"]
        if self.options.expectations:
            parts += ["--expectations", shlex.quote(_absolute(self.options.expectations))]
        if self.report_dir is not None:
            parts += [
                "--report-dir",
                shlex.quote(str(Path(self.report_dir).resolve() / "rerun")),
                "--overwrite",
            ]
        return " ".join(parts)

    def rerun_environment(self) -> dict[str, str]:
        """The variables a rerun must set: those the run found (not the OPCORE_PLATFORM
        that --platform set, which the rerun's own --platform sets again)."""
        env = {k: v for k, v in self.environment.items() if k != "OPCORE_PLATFORM"}
        control = getattr(self.ctx.platform, "device_control_env_var", None) if self.ctx else None
        if control and os.environ.get(control) is not None:
            env[control] = os.environ[control]
        return env

    # ------------------------------------------------------------------ reporting
    def header(self) -> dict[str, Any]:
        """The JSONL header. Before setup has resolved the platform (a run stopped there)
        it holds what is known without one: platform, device and seed are null."""
        from opcore_conformance import __version__, irapi

        head: dict[str, Any] = {
            "type": "header",
            "schema": REPORT_SCHEMA,
            "suite": f"opcore-conformance@{__version__}",
            "platform": self.options.platform,
            "platform_class": None,
            "platform_distribution": None,
            "device": None,
            "device_type": None,
            "device_name": None,
            "versions": {
                "opcore": _version("opcore"),
                "opcore-conformance": __version__,
                "torch": torch.__version__,
                "triton": _version("triton"),
                "python": _pyplatform.python_version(),
            },
            "providers": {},
            "seed": None,
            "mode": self.options.mode,
            "case_timeout_s": self.options.case_timeout_s,
            "filters": {
                "ops": self.options.ops,
                "providers": self.options.providers,
                "dtypes": self.options.dtypes,
                "checks": self.options.checks,
                "cases": self.options.cases,
                "imports": self.options.imports,
            },
            "expectations": self.expectations.source,
            "environment": {
                k: v
                for k, v in os.environ.items()
                if k.startswith("OPCORE_") or k in _RERUN_VARIABLES
            },
            "reference": {"device": "cpu", "dtype": "float64"},
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "argv": sys.argv,
        }
        if self.ctx is None:
            return head
        p = self.ctx.platform
        try:
            device_name = p.get_device_name(0)
        except Exception as exc:  # reported by platform.device_queries as well
            device_name = f"<get_device_name failed: {exc}>"
        head.update(
            {
                "platform": p.name,
                "platform_class": f"{type(p).__module__}.{type(p).__qualname__}",
                "platform_distribution": _distribution_of(type(p).__module__),
                "device": str(self.ctx.device),
                "device_type": p.device_type,
                "device_name": device_name,
                "providers": irapi.provider_table(),
                "seed": self.ctx.seed,
                # For certificate.json: what a certificate must name to be checked later.
                "identities": _identities(),
                "device_summary": _device_summary(p),
                "driver": {"cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)},
            }
        )
        return head

    def exit_code(self) -> int:
        return 1 if any(S.is_red(r.status) for r in self.results) else 0


def _identities() -> dict[str, dict[str, dict[str, str | None]]]:
    """``{op: {provider: {"identity": full hash, "distribution": "name@version"}}}``: the
    whole identity hash (the header's provider table shows a prefix) and the distribution
    whose module defines the provider."""
    try:
        from opcore.ir import all_ops
    except ImportError:
        return {}
    out: dict[str, dict[str, dict[str, str | None]]] = {}
    for name, op in all_ops().items():
        out[name] = {}
        for provider, impl in op.impls.items():
            try:
                ident = impl.identity_hash()
            except Exception:  # a provider without readable source: no identity to certify
                ident = None
            module = getattr(impl.impl_fn, "__module__", None) or ""
            out[name][provider] = {
                "identity": ident,
                "distribution": _distribution_of(module) if module else None,
            }
    return out


def _device_summary(platform: Any) -> dict[str, Any]:
    try:
        return platform.device_summary()
    except Exception as exc:  # reported by the platform checks; the certificate says so
        return {"error": f"{type(exc).__name__}: {exc}"}


def _absolute(path: str) -> str:
    # "none" is a keyword, not a path
    return path if path.lower() == "none" else str(Path(path).resolve())


def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _distribution_of(module: str) -> str | None:
    top = module.split(".")[0]
    for dist_name in _packages_distributions().get(top, []):
        return f"{dist_name}@{_version(dist_name)}"
    return None


@functools.lru_cache(maxsize=1)
def _packages_distributions() -> Mapping[str, list[str]]:
    # Scans every installed distribution: once per run, not once per provider.
    import importlib.metadata as md

    return md.packages_distributions()
