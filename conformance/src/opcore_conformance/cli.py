"""``opcore conformance``: the command-line front end of the suite.

`add_arguments` fills a parser (the ``opcore`` CLI calls it for its ``conformance``
subcommand; ``python -m opcore_conformance`` builds its own); `run` runs it. This module
imports nothing heavy at import time, so ``opcore --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys

from opcore.cli.argtypes import positive_finite_float  # torch-free
from opcore_conformance.watchdog import DEFAULT_CASE_TIMEOUT_S, parse_bound  # stdlib only

DESCRIPTION = (
    "Check the current platform (or --platform NAME) against opcore's reference semantics: "
    "the platform contract, every op x provider x dtype x sample against the native reference, "
    "the functional contract, supports_args, torch.library.opcheck, determinism, layers and "
    "attention backends. Exit status 1 when a case fails, errors or passes unexpectedly."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--platform",
        metavar="NAME",
        help="run on this platform plugin (sets OPCORE_PLATFORM for the run)",
    )
    parser.add_argument("--ops", metavar="A,B", help="only these ops (comma-separated)")
    parser.add_argument("--providers", metavar="A,B", help="only these providers")
    parser.add_argument(
        "--dtypes", metavar="A,B", help="only these dtypes (float32, float16, bfloat16)"
    )
    parser.add_argument(
        "--checks",
        metavar="A,B",
        help="only these checks (platform, numerics, functional, maybe_inplace, "
        "determinism, supports_args, opcheck, layers, attention, compile; "
        "or a sub-check such as platform.dtype)",
    )
    parser.add_argument(
        "--case",
        action="append",
        metavar="ID",
        dest="cases",
        help="run exactly this case id (globs with * and ? allowed; repeatable); "
        "the form every failure's rerun command uses",
    )
    parser.add_argument(
        "--import",
        action="append",
        dest="imports",
        metavar="MODULE",
        help="import MODULE before collecting (repeatable): providers no plugin "
        "registers on this platform, e.g. opcore.kernels.triton with "
        "TRITON_INTERPRET=1 on the CPU",
    )
    parser.add_argument(
        "--device-index",
        type=int,
        default=0,
        metavar="N",
        help="run the cases on the platform's device N (default 0): a second "
        "device of a multi-device platform",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick",
        dest="quick",
        action="store_true",
        default=True,
        help="the op generators' quick sample sets (default)",
    )
    mode.add_argument(
        "--full", dest="quick", action="store_false", help="the whole grid of samples"
    )
    parser.add_argument(
        "--report-dir",
        metavar="DIR",
        default=None,
        help="write conformance.jsonl, conformance.md and conformance-junit.xml "
        "exactly here; refused when DIR already holds reports, unless "
        "--overwrite (default: a new directory per run, "
        "./opcore-reports/<UTC time>, with ./opcore-reports/latest "
        "pointing at the last)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="let --report-dir replace the reports already in DIR, and "
        "--draft-expectations the file already there",
    )
    parser.add_argument(
        "--expectations",
        metavar="FILE",
        help="the expectations TOML file (default: the platform's own, from its "
        "conformance_expectations attribute; 'none' to ignore it)",
    )
    parser.add_argument(
        "--dump",
        metavar="DIR",
        help="with --case: write each numerics case's inputs, float64 reference, "
        "provider and native outputs (torch.save) and a standalone repro.py "
        "that shows the mismatch without the suite, to DIR/<case id>/",
    )
    parser.add_argument(
        "--draft-expectations",
        metavar="FILE",
        help="after the run, write FILE: an expectations file with an xfail entry "
        "per group of identical failures, each with a reason to fill in; refused "
        "before the run when FILE exists, unless --overwrite",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        dest="list_only",
        help="list the selected case ids as JSON lines and exit",
    )
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bar on stderr"
    )
    parser.add_argument(
        "--case-timeout",
        metavar="S",
        default=None,
        help="the wall-clock bound on each case, in seconds (default "
        f"{DEFAULT_CASE_TIMEOUT_S:g}): a case past it is an error and the run goes on",
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        metavar="N",
        help="run the collective checks instead, across N local processes (one device "
        "each, the platform's torch.distributed backend; 127.0.0.1 only): collective ops "
        "against a float64 reference, bitwise agreement across ranks, declared "
        "properties, and a killed rank that must make the others fail, not hang "
        "(--checks collectives or killed_rank runs one of the two phases)",
    )
    parser.add_argument(
        "--collective-timeout",
        type=positive_finite_float,
        default=60.0,
        metavar="S",
        help="with --world-size: the bound on every collective wait, in seconds, a "
        "positive finite number (default 60)",
    )


def options_from_args(args: argparse.Namespace):
    from opcore_conformance.options import Options, parse_list

    return Options(
        platform=args.platform,
        ops=parse_list(args.ops),
        providers=parse_list(args.providers),
        dtypes=parse_list(args.dtypes),
        checks=parse_list(args.checks),
        cases=args.cases,
        imports=args.imports,
        device_index=args.device_index,
        quick=args.quick,
        report_dir=args.report_dir or None,
        overwrite=args.overwrite,
        expectations=args.expectations,
        progress=args.progress,
        dump=args.dump or None,
        draft_expectations=args.draft_expectations or None,
        # checked here, not by argparse: one line naming the flag, not usage + error
        case_timeout_s=DEFAULT_CASE_TIMEOUT_S
        if args.case_timeout is None
        else parse_bound(args.case_timeout, "--case-timeout"),
    )


def _say_dumped(base) -> None:
    folders = (
        sorted(p for p in base.iterdir() if (p / "repro.py").is_file()) if base.is_dir() else []
    )
    if folders:
        print(
            f"opcore conformance: dumped {len(folders)} case(s) under {base} "
            f"(each: python {folders[0] / 'repro.py'})",
            file=sys.stderr,
        )
    else:
        print(
            f"opcore conformance: --dump {base}: no numerics case ran, nothing dumped "
            f"(dumps are written for numerics[...] cases)",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    """Run the suite. SIGINT and SIGTERM are handled from here on (before torch is
    imported): a stopped run exits 128 + the signal's number with one line, never a
    traceback, and the reports it could write (`opcore_conformance.runner.run`)."""
    from opcore_conformance.interrupt import Interrupted, Interruptions, exit_status

    with Interruptions() as interruptions:
        try:
            try:
                options = options_from_args(args)
            except ValueError as exc:
                print(f"opcore conformance: {exc}", file=sys.stderr)
                return 2
            if args.overwrite and args.report_dir is None and args.draft_expectations is None:
                print(
                    "opcore conformance: --overwrite needs --report-dir or "
                    "--draft-expectations (without them each run writes a new directory "
                    "and overwrites nothing)",
                    file=sys.stderr,
                )
                return 2
            if args.dump and not args.cases:
                print(
                    "opcore conformance: --dump needs --case ID (a dump is written per case; "
                    "name the cases to dump)",
                    file=sys.stderr,
                )
                return 2
            if args.world_size is not None:
                ignored = [
                    flag
                    for flag, given in (
                        ("--case", args.cases),
                        ("--dump", args.dump),
                        ("--list", args.list_only),
                        ("--full", not args.quick),
                        ("--expectations", args.expectations),
                        ("--draft-expectations", args.draft_expectations),
                        ("--device-index", args.device_index != 0),
                        ("--case-timeout", args.case_timeout is not None),
                    )
                    if given
                ]
                if ignored:
                    print(
                        f"opcore conformance: --world-size runs the collective checks, which "
                        f"take no {', '.join(ignored)} (each rank uses device rank % count)",
                        file=sys.stderr,
                    )
                    return 2
                from opcore_conformance.world import run_world

                return run_world(
                    options, args.world_size, collective_timeout_s=args.collective_timeout
                )
            from opcore_conformance.runner import run as run_session

            status = run_session(options, list_only=args.list_only, interruptions=interruptions)
            if options.dump is not None and not args.list_only:
                _say_dumped(options.dump)
            return status
        except Interrupted as exc:  # while importing torch, before the runner took over
            print(
                f"opcore conformance: interrupted by {exc.signal_name} before the run "
                f"started; no report written",
                file=sys.stderr,
            )
            return exit_status(exc.signal_name)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """For ``opcore``'s subcommand table: ``opcore conformance ...``."""
    parser = subparsers.add_parser(
        "conformance",
        help="check this platform against the reference semantics",
        description=DESCRIPTION,
    )
    add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opcore_conformance", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
