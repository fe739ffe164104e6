"""Run a whole conformance session outside pytest (the `opcore conformance` command)."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from typing import Any, TextIO

from opcore_conformance import report
from opcore_conformance.interrupt import SIGNALS, Interrupted, Interruptions, exit_status
from opcore_conformance.options import Options
from opcore_conformance.report import dirs, markdown, terminal
from opcore_conformance.report.progress import Progress, expected_cost
from opcore_conformance.session import ConformanceSession, SetupError
from opcore_conformance.watchdog import CASE_TIMEOUT, Watchdog

EXIT_RED = 1
EXIT_USAGE = 2


def run(
    options: Options,
    *,
    out: TextIO | None = None,
    list_only: bool = False,
    interruptions: Interruptions | None = None,
) -> int:
    """Run (or with ``list_only`` list) the cases; write the reports; return the exit status:
    0 when nothing failed, errored or passed unexpectedly, 1 otherwise, 2 when the run
    could not start (a bad option, expectations file or report directory: checked before
    any case runs), 128 + the signal's number when SIGINT or SIGTERM stopped it.

    A stopped run writes what it has, marked incomplete, wherever the signal came: in setup
    or collection (a header and a footer saying so, no cases) or between cases.
    ``interruptions``: the caller's installed handlers (the CLI installs them before it
    imports torch); without, this call installs its own."""
    if interruptions is None:
        with Interruptions() as own:
            return run(options, out=out, list_only=list_only, interruptions=own)
    out = out or sys.stdout
    rd = None
    try:
        session = ConformanceSession(options)
        if not list_only:
            rd = dirs.claim(options.report_dir, overwrite=options.overwrite)
            session.report_dir = rd.path
    except dirs.ReportDirError as exc:
        print(f"opcore conformance: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Interrupted as exc:
        return _stopped_early(exc.signal_name, rd)
    try:
        return _run(session, rd, out, list_only, interruptions)
    except SetupError as exc:
        dirs.release(rd)
        print(f"opcore conformance: {exc}", file=sys.stderr)
        return EXIT_USAGE


@dataclasses.dataclass
class _State:
    """How far the run got. The watchdog's thread reads it when it finishes the reports of
    a run whose main thread is stuck (`_take_over`)."""

    phase: str = "setup"
    cases: list | None = None
    stream: Any = None  # the JSONL stream, once the cases start
    paths: dict | None = None


def _run(
    session: ConformanceSession,
    rd: dirs.ReportDir | None,
    out: TextIO,
    list_only: bool,
    intr: Interruptions,
) -> int:
    # One watchdog for the whole run: every case's time bound, and a way out when the main
    # thread is stuck where neither that bound nor a signal's handler can reach it.
    st = _State()
    dog = Watchdog(
        session.options.case_timeout_s,
        takeover=functools.partial(_take_over, session, rd, out, st),
        signals=SIGNALS,
    )
    session.watchdog = dog
    with dog:
        return _steps(session, rd, out, list_only, intr, st, dog)


def _steps(
    session: ConformanceSession,
    rd: dirs.ReportDir | None,
    out: TextIO,
    list_only: bool,
    intr: Interruptions,
    st: _State,
    dog: Watchdog,
) -> int:
    options = session.options
    try:
        session.setup()
        intr.check()  # a signal whose exception plugin code swallowed
        st.phase = "collection"
        st.cases = cases = session.collect()
        intr.check()
        if list_only:
            for case in cases:
                out.write(
                    json.dumps(
                        {
                            "id": case.id,
                            "check": case.check,
                            "op": case.op,
                            "provider": case.provider,
                            "dtype": case.dtype,
                            "sample": case.sample,
                            "preset": case.preset,
                        }
                    )
                    + "\n"
                )
            return 0
        if options.cases is not None and not cases:
            raise SetupError(f"no case matches {options.cases}")
        st.phase = "cases"
        assert rd is not None  # run() claims the report directory unless list_only
        st.stream, st.paths = report.open_stream(rd.path, session.header())
        costs = [expected_cost(c.check, c.info.get("mode")) for c in cases]
        progress = Progress(len(cases), enabled=options.progress, weight=sum(costs))
        for case, cost in zip(cases, costs, strict=True):
            result = session.run(case)
            if intr.signal_name:  # the signal came inside the case and was swallowed there
                session.results.pop()
                break
            if not dog.write(st.stream.add, result.to_record()):
                break  # the watchdog took over (it ends the process)
            progress.update(case.id, result.status, cost)
    except Interrupted:
        pass
    except SetupError:
        if not intr.signal_name:
            raise
        # plugin code caught the interruption and setup failed of it: still a stop
    finally:
        # From here on a signal is only recorded: the reports are finished either way.
        intr.raising = False
        finishing = dog.start_finishing()
    if not finishing:
        return 1  # the watchdog wrote the reports (not reached: it ends the process)
    if list_only:  # interrupted while listing: nothing to write
        return _stopped_early(intr.signal_name, None)
    assert rd is not None  # run() claims the report directory unless list_only
    return _finish(session, rd, out, st, intr.signal_name)


def _take_over(
    session: ConformanceSession,
    rd: dirs.ReportDir | None,
    out: TextIO,
    st: _State,
    kind: str,
    what: Any,
) -> int:
    """On the watchdog's thread, when the main thread is stuck: ``kind`` "case" (``what``:
    the slot of a case past its bound that no exception stops) or "signal" (``what``: the
    signal's name). Writes the reports as the main thread would; the process then exits."""
    if kind == "case":
        result = session.stuck(what.case, time.monotonic() - what.start)
        if st.stream is not None:
            st.stream.add(result.to_record())
        interrupted = CASE_TIMEOUT
    else:
        interrupted = what
    if rd is None:  # --list: nothing to write
        return _stopped_early(interrupted, None)
    return _finish(session, rd, out, st, interrupted)


def _finish(
    session: ConformanceSession,
    rd: dirs.ReportDir,
    out: TextIO,
    st: _State,
    interrupted: str | None,
) -> int:
    """Close the JSONL (with its footer), derive the other reports, print the summary;
    the exit status."""
    options = session.options
    if st.stream is None or st.paths is None:
        st.stream, st.paths = report.open_stream(rd.path, session.header())
    foot = st.stream.close(
        collected=None if st.cases is None else len(st.cases),
        interrupted=interrupted,
        stopped_in=st.phase,
    )
    report.derive(st.paths)
    dirs.mark_latest(rd)
    records = st.stream.records  # exactly what the JSONL holds
    note = markdown.incomplete_note(foot, records)
    out.write(
        terminal.render(session.header(), records, {k: str(v) for k, v in st.paths.items()}, note)
        + "\n"
    )
    out.flush()
    if options.draft_expectations is not None:
        from opcore_conformance import draft

        n = draft.write(
            options.draft_expectations,
            records,
            platform=session.header().get("platform"),
            mode=options.mode,
        )
        print(
            f"opcore conformance: drafted {n} xfail entr{'y' if n == 1 else 'ies'} in "
            f"{options.draft_expectations}: fill in each reason",
            file=sys.stderr,
        )
    if interrupted == CASE_TIMEOUT:
        print(
            f"opcore conformance: {records[-1]['id']} ran past its time bound "
            f"({options.case_timeout_s:g} s) and could not be stopped; the run ended there, "
            f"the reports hold what ran: {rd.path}",
            file=sys.stderr,
        )
        return 1
    if interrupted:
        print(
            f"opcore conformance: {note or f'stopped by {interrupted}'}; "
            f"the reports hold what ran: {rd.path}",
            file=sys.stderr,
        )
        return exit_status(interrupted)
    return foot["exit_status"]


def _stopped_early(signal_name: str | None, rd: dirs.ReportDir | None) -> int:
    dirs.release(rd)
    name = signal_name or "SIGINT"
    print(
        f"opcore conformance: interrupted by {name} before the run started; no report written",
        file=sys.stderr,
    )
    return exit_status(name)
