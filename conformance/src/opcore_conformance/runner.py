"""Run a whole conformance session outside pytest (the `opcore conformance` command)."""

from __future__ import annotations

import json
import sys
from typing import TextIO

from opcore_conformance import report
from opcore_conformance.options import Options
from opcore_conformance.report import terminal
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
    progress = Progress(len(cases), enabled=options.progress)
    for case in cases:
        result = session.run(case)
        progress.update(case.id, result.status)
    header = session.header()
    records = [r.to_record() for r in session.results]
    paths = report.write_all(options.report_dir, header, records)
    out.write(terminal.render(header, records, {k: str(v) for k, v in paths.items()}) + "\n")
    return session.exit_code()
