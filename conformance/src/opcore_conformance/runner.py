"""Run a whole conformance session outside pytest (the `opcore conformance` command)."""

from __future__ import annotations

import json
import sys
from typing import TextIO

from opcore_conformance import report
from opcore_conformance.interrupt import Interrupted, Interruptions, exit_status
from opcore_conformance.options import Options
from opcore_conformance.report import dirs, markdown, terminal
from opcore_conformance.report.progress import Progress, expected_cost
from opcore_conformance.session import ConformanceSession, SetupError

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


def _run(
    session: ConformanceSession,
    rd: dirs.ReportDir | None,
    out: TextIO,
    list_only: bool,
    intr: Interruptions,
) -> int:
    options = session.options
    phase, cases, stream, paths = "setup", None, None, None
    try:
        session.setup()
        intr.check()  # a signal whose exception plugin code swallowed
        phase = "collection"
        cases = session.collect()
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
        phase = "cases"
        assert rd is not None  # run() claims the report directory unless list_only
        stream, paths = report.open_stream(rd.path, session.header())
        costs = [expected_cost(c.check, c.info.get("mode")) for c in cases]
        progress = Progress(len(cases), enabled=options.progress, weight=sum(costs))
        for case, cost in zip(cases, costs, strict=True):
            result = session.run(case)
            if intr.signal_name:  # the signal came inside the case and was swallowed there
                session.results.pop()
                break
            stream.add(result.to_record())
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
    if list_only:  # interrupted while listing: nothing to write
        return _stopped_early(intr.signal_name, None)
    assert rd is not None  # run() claims the report directory unless list_only
    if stream is None or paths is None:
        stream, paths = report.open_stream(rd.path, session.header())
    foot = stream.close(
        collected=None if cases is None else len(cases),
        interrupted=intr.signal_name,
        stopped_in=phase,
    )
    report.derive(paths)
    dirs.mark_latest(rd)
    records = stream.records  # exactly what the JSONL holds
    note = markdown.incomplete_note(foot, records)
    out.write(
        terminal.render(session.header(), records, {k: str(v) for k, v in paths.items()}, note)
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
    if intr.signal_name:
        print(
            f"opcore conformance: {note or f'stopped by {intr.signal_name}'}; "
            f"the reports hold what ran: {rd.path}",
            file=sys.stderr,
        )
        return exit_status(intr.signal_name)
    return foot["exit_status"]


def _stopped_early(signal_name: str | None, rd: dirs.ReportDir | None) -> int:
    dirs.release(rd)
    name = signal_name or "SIGINT"
    print(
        f"opcore conformance: interrupted by {name} before the run started; no report written",
        file=sys.stderr,
    )
    return exit_status(name)
