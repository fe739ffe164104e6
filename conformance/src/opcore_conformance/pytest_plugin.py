"""The pytest front end: ``pytest --opcore`` runs the conformance suite as pytest items.

Installed as a ``pytest11`` entry point, so it is loaded in every pytest run but stays
inert unless ``--opcore`` (or any other ``--opcore-*`` option) is given. Each case becomes
one item named by its case id, e.g. ``numerics[rms_norm-triton-bfloat16-odd_hidden_4099]``,
under the node ``opcore-conformance``; statuses map to pytest outcomes (pass; fail, error and
xpass fail the item; xfail is xfailed; skip, unsupported and not_applicable are skipped
with the status in the reason). The reports are the CLI's, written at session end.

``--opcore-only`` ignores the test files pytest would otherwise collect (what a plugin's
CI wants when it only runs the suite).
"""

from __future__ import annotations

from typing import Any

import pytest

from opcore_conformance.watchdog import DEFAULT_CASE_TIMEOUT_S  # stdlib only

_ACTIVATING = (
    "opcore_platform",
    "opcore_ops",
    "opcore_providers",
    "opcore_dtypes",
    "opcore_checks",
    "opcore_cases",
    "opcore_imports",
    "opcore_full",
    "opcore_report_dir",
    "opcore_expectations",
    "opcore_overwrite",
    "opcore_case_timeout",
)
_KEY = pytest.StashKey["Any"]()
_DIR_KEY = pytest.StashKey["Any"]()  # the claimed report directory (report.dirs.ReportDir)
_DOG_KEY = pytest.StashKey["Any"]()  # the entered `opcore_conformance.watchdog.Watchdog`


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("opcore", "opcore conformance suite")
    g.addoption(
        "--opcore",
        action="store_true",
        default=False,
        help="run the opcore conformance suite against the current platform",
    )
    g.addoption(
        "--opcore-only",
        action="store_true",
        default=False,
        help="with --opcore: collect nothing but the conformance cases",
    )
    g.addoption(
        "--opcore-platform", metavar="NAME", help="platform plugin to run on (sets OPCORE_PLATFORM)"
    )
    g.addoption("--opcore-ops", metavar="A,B", help="only these ops")
    g.addoption("--opcore-providers", metavar="A,B", help="only these providers")
    g.addoption("--opcore-dtypes", metavar="A,B", help="only these dtypes")
    g.addoption("--opcore-checks", metavar="A,B", help="only these checks (e.g. numerics,platform)")
    g.addoption(
        "--opcore-case",
        action="append",
        dest="opcore_cases",
        metavar="ID",
        help="exactly this case id (globs * and ?; repeatable)",
    )
    g.addoption(
        "--opcore-import",
        action="append",
        dest="opcore_imports",
        metavar="MODULE",
        help="import MODULE before collecting (providers no plugin registers here)",
    )
    g.addoption(
        "--opcore-quick", action="store_true", default=False, help="quick sample sets (default)"
    )
    g.addoption("--opcore-full", action="store_true", default=False, help="the whole grid")
    g.addoption(
        "--opcore-report-dir",
        metavar="DIR",
        help="write the reports exactly here, refused when DIR holds reports unless "
        "--opcore-overwrite (default: a new ./opcore-reports/<UTC time> per run)",
    )
    g.addoption(
        "--opcore-overwrite",
        action="store_true",
        default=False,
        help="let --opcore-report-dir replace the reports already there",
    )
    g.addoption(
        "--opcore-expectations",
        metavar="FILE",
        help="expectations TOML (default: the platform's own; 'none' to ignore it)",
    )
    g.addoption(
        "--opcore-case-timeout",
        metavar="S",
        help="the wall-clock bound on each case, in seconds (default "
        f"{DEFAULT_CASE_TIMEOUT_S:g}): a case past it is an error and the run goes on",
    )


def _active(config: pytest.Config) -> bool:
    if (
        config.getoption("opcore")
        or config.getoption("opcore_only")
        or config.getoption("opcore_quick")
    ):
        return True
    return any(config.getoption(name) for name in _ACTIVATING)


def pytest_configure(config: pytest.Config) -> None:
    if not _active(config):
        return
    if config.getoption("opcore_quick") and config.getoption("opcore_full"):
        raise pytest.UsageError("--opcore-quick and --opcore-full exclude each other")
    from opcore_conformance.options import Options, parse_list
    from opcore_conformance.report import dirs
    from opcore_conformance.session import ConformanceSession, SetupError
    from opcore_conformance.watchdog import Watchdog, parse_bound

    try:
        timeout = config.getoption("opcore_case_timeout")
        options = Options(
            platform=config.getoption("opcore_platform"),
            ops=parse_list(config.getoption("opcore_ops")),
            providers=parse_list(config.getoption("opcore_providers")),
            dtypes=parse_list(config.getoption("opcore_dtypes")),
            checks=parse_list(config.getoption("opcore_checks")),
            cases=config.getoption("opcore_cases"),
            imports=config.getoption("opcore_imports"),
            quick=not config.getoption("opcore_full"),
            report_dir=config.getoption("opcore_report_dir") or None,
            overwrite=config.getoption("opcore_overwrite"),
            expectations=config.getoption("opcore_expectations"),
            progress=False,
            case_timeout_s=DEFAULT_CASE_TIMEOUT_S
            if timeout is None
            else parse_bound(timeout, "--opcore-case-timeout"),
        )
        # The directory first (cheap), as the command line does: an unusable one, or one
        # holding an earlier run's reports, stops pytest before anything runs.
        rd = dirs.claim(
            options.report_dir,
            overwrite=options.overwrite,
            options=("--opcore-report-dir", "--opcore-overwrite"),
        )
    except ValueError as exc:  # ReportDirError is a ValueError
        raise pytest.UsageError(f"opcore conformance: {exc}") from None
    try:
        session = ConformanceSession(options)
        session.report_dir = rd.path
        session.setup()
    except (ValueError, SetupError) as exc:
        dirs.release(rd)
        raise pytest.UsageError(f"opcore conformance: {exc}") from None
    config.stash[_DIR_KEY] = rd
    config.stash[_KEY] = session
    # The bound on each case; no signal takeover here (SIGINT is pytest's own).
    session.watchdog = config.stash[_DOG_KEY] = Watchdog(
        options.case_timeout_s, takeover=lambda kind, slot: _take_over(config, slot)
    ).__enter__()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _DOG_KEY in config.stash:
        config.stash[_DOG_KEY].__exit__(None, None, None)


def _take_over(config: pytest.Config, slot) -> int:
    """On the watchdog's thread: a case is stuck past its bound where no exception reaches
    it, so this session cannot go on. Its reports are written, marked incomplete, and the
    process ends with status 1 (pytest's own reports are not written)."""
    import sys
    import time

    from opcore_conformance import report
    from opcore_conformance.report import dirs
    from opcore_conformance.watchdog import CASE_TIMEOUT

    conf = config.stash[_KEY]
    result = conf.stuck(slot.case, time.monotonic() - slot.start)
    records = [r.to_record() for r in conf.results]
    report.write_all(
        conf.report_dir, conf.header(), records, collected=conf.collected, interrupted=CASE_TIMEOUT
    )
    dirs.mark_latest(config.stash[_DIR_KEY])
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # else the line goes to a capture file the exit discards
        capture.suspend_global_capture(in_=False)
    print(
        f"\nopcore conformance: {result.case.id}: {result.message}; the reports hold what ran: "
        f"{conf.report_dir}",
        file=sys.stderr,
    )
    return 1


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
    if config.getoption("opcore_only"):
        return True
    return None


class ConformanceFailure(Exception):
    """A red case (fail, error, xpass)."""


class ConformanceItem(pytest.Item):
    def __init__(self, *, case, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.result = None

    def runtest(self) -> None:
        from opcore_conformance import status as S

        session = self.config.stash[_KEY]
        result = self.result = session.run(self.case)
        status = result.status
        if status == S.PASS:
            return
        if status in S.RED:
            raise ConformanceFailure(result)
        if status == S.XFAIL:
            pytest.xfail(f"{result.expectation_reason} ({result.message})")
        pytest.skip(f"{status}: {result.message}")

    def repr_failure(self, excinfo, style=None) -> str | Any:  # str, or pytest's TerminalRepr
        if isinstance(excinfo.value, ConformanceFailure):
            r = excinfo.value.args[0]
            text = f"{r.status}: {r.message}"
            tb = r.metrics.get("traceback")
            if tb:
                text += "\n" + tb
            return text + f"\nrerun: {r.repro}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, self.case.id


class ConformanceCollector(pytest.Collector):
    def collect(self):
        session = self.config.stash[_KEY]
        for case in session.collect():
            yield ConformanceItem.from_parent(self, name=case.id, case=case)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list
) -> None:
    if _KEY not in config.stash:
        return
    collector = ConformanceCollector.from_parent(session, name="opcore-conformance")
    items.extend(collector.collect())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _KEY not in config.stash:
        return
    from opcore_conformance import report
    from opcore_conformance.report import dirs

    conf = config.stash[_KEY]
    if not conf.results:
        dirs.release(config.stash[_DIR_KEY])
        return
    records = [r.to_record() for r in conf.results]
    interrupted = "SIGINT" if exitstatus == pytest.ExitCode.INTERRUPTED else None
    conf.paths = report.write_all(
        conf.report_dir, conf.header(), records, collected=conf.collected, interrupted=interrupted
    )
    dirs.mark_latest(config.stash[_DIR_KEY])


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _KEY not in config.stash:
        return
    from opcore_conformance.report import terminal

    conf = config.stash[_KEY]
    if not conf.results:
        return
    records = [r.to_record() for r in conf.results]
    paths = getattr(conf, "paths", None)
    terminalreporter.write_sep("=", "opcore conformance")
    terminalreporter.write_line(
        terminal.render(conf.header(), records, {k: str(v) for k, v in (paths or {}).items()})
    )
