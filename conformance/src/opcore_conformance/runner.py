"""Run a whole conformance session outside pytest (the `opcore conformance` command)."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from typing import TextIO

from opcore_conformance import report
from opcore_conformance.options import Options
from opcore_conformance.report import markdown, terminal
from opcore_conformance.report.progress import Progress
from opcore_conformance.session import ConformanceSession, SetupError

EXIT_RED = 1
EXIT_USAGE = 2


def run(options: Options, *, out: TextIO | None = None, list_only: bool = False) -> int:
    """Run (or with ``list_only`` list) the cases; write the reports; return the exit status:
    0 when nothing failed, errored or passed unexpectedly, 1 otherwise, 2 when the run
    could not start."""
    out = out or sys.stdout
    session = ConformanceSession(options)
    try:
        session.setup()
        cases = session.collect()
    except SetupError as exc:
        print(f"opcore conformance: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if list_only:
        for case in cases:
            out.write(json.dumps({"id": case.id, "check": case.check, "op": case.op,
                                  "provider": case.provider, "dtype": case.dtype,
                                  "sample": case.sample, "preset": case.preset}) + "\n")
        return 0
    if options.cases is not None and not cases:
        print(f"opcore conformance: no case matches {options.cases}", file=sys.stderr)
        return EXIT_USAGE
    header = session.header()
    stream, paths = report.open_stream(options.report_dir, header)
    progress = Progress(len(cases), enabled=options.progress)
    with _signals_as_interruptions() as received:
        try:
            for case in cases:
                result = session.run(case)
                if received:  # the signal came inside the case and was swallowed there
                    session.results.pop()
                    break
                stream.add(result.to_record())
                progress.update(case.id, result.status)
        except _Interrupted:
            pass
    interrupted = received[0] if received else None
    foot = stream.close(collected=len(cases), interrupted=interrupted)
    report.derive(paths)
    records = stream.records  # exactly what the JSONL holds
    note = markdown.incomplete_note(foot, records)
    out.write(terminal.render(header, records, {k: str(v) for k, v in paths.items()}, note) + "\n")
    if interrupted:
        print(f"opcore conformance: {note}; the reports hold those", file=sys.stderr)
        return 128 + int(getattr(signal, interrupted))
    return foot["exit_status"]


class _Interrupted(BaseException):
    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


@contextlib.contextmanager
def _signals_as_interruptions():
    """SIGINT and SIGTERM (Ctrl-C, `timeout`, a CI job's cancel) end the run, with the
    reports written for the cases that finished. Yields a list that receives the signal's
    name: the handler also raises, but code under test (torch.compile, say) may catch and
    wrap that, so the loop checks the list after each case too. Only the main thread can
    install handlers; elsewhere the default behaviour stays."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum, _frame):
        received.append(signal.Signals(signum).name)
        raise _Interrupted(received[0])

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
